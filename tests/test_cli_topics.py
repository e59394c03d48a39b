"""The topic commands of the `ignis` console script, end to end in a subprocess against a fresh lmdb store: `ignis
topic apply/list/describe/delete`, `ignis publish --topic --subject`, `ignis queue seek`, and `ignis up`'s manifest
sync of IgnisTopic documents; bad input is one line on stderr and exit 2, an unknown topic exit 3."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from test_cli import IGNIS, Run, ignis  # noqa: F401  (the fixture)

MANIFESTS = """\
apiVersion: ignismq.io/v1alpha1
kind: IgnisTopic
metadata: {name: sensors}
spec: {shards: 4, retentionSeconds: 3600}
---
apiVersion: ignismq.io/v1alpha1
kind: IgnisQueue
metadata: {name: temps}
spec:
  handlerType: temps
  subscribe: {topic: sensors, filter: "sensors/+/temp", start: earliest}
"""


def test_topics_from_manifests_publish_consume_seek_and_delete(ignis: Run, tmp_path: Path) -> None:  # noqa: F811
    (tmp_path / "m.yaml").write_text(MANIFESTS)
    assert ignis("topic", "apply", "-f", str(tmp_path / "m.yaml"), "-o", "json").json() == [
        {"name": "sensors", "clientId": "default", "action": "created"}]
    assert ignis("queue", "apply", "-f", str(tmp_path / "m.yaml")).code == 0
    for subject, value in (("sensors/kitchen/temp", "21.5"), ("sensors/kitchen/humidity", "40"),
                           ("sensors/hall/temp", "19")):
        published = ignis("publish", "--topic", "sensors", "--subject", subject, value, "-o", "json").json()
        assert published["topic"] == "sensors" and published["published"] == 1
    [listed] = ignis("topic", "list", "-o", "json").json()
    assert listed == {"name": "sensors", "shards": 4, "retentionSeconds": 3600, "retentionBytes": None,
                      "subscriptions": ["temps"]}
    described = ignis("topic", "describe", "sensors", "-o", "json").json()
    assert described["stats"]["published"] == 3 and described["stats"]["retained"] == 3
    got = ignis("consume", "temps", "-n", "10", "-o", "json").json()
    assert sorted(m["payload"] for m in got) == ["19", "21.5"]  # the filter's two
    assert ignis("consume", "temps", "-n", "10", "-o", "json").json() == []
    seek = ignis("queue", "seek", "temps", "--to", "earliest", "-o", "json").json()
    assert seek["name"] == "temps" and set(seek["positions"]) == {"0", "1", "2", "3"}
    assert len(ignis("consume", "temps", "-n", "10", "-o", "json").json()) == 2  # delivered again
    stats = ignis("stats", "temps", "-o", "json").json()
    assert stats["topic"] == "sensors" and stats["expired"] == 0
    refused = ignis("topic", "delete", "sensors", "-y")
    assert refused.code == 2 and "read by subscription(s) temps" in refused.error_line()
    assert ignis("topic", "delete", "sensors", "-y", "--force", "-o", "json").json()["deleted"] is True
    assert ignis("topic", "list", "-o", "json").json() == []


def test_bad_topic_input_is_one_line_and_exit_2_an_unknown_topic_exit_3(ignis: Run, tmp_path: Path) -> None:  # noqa: F811
    (tmp_path / "m.yaml").write_text(MANIFESTS)
    ignis("topic", "apply", "-f", str(tmp_path / "m.yaml"))
    for args, words in (
        (("publish", "--topic", "sensors", "--subject", "a/+", "x"), "'+' is not allowed in a published subject"),
        (("publish", "--topic", "sensors", "x"), "--topic needs --subject"),
        (("publish", "--topic", "sensors", "--subject", "a", "--delay", "5s", "x"), "--delay is for queues"),
        (("publish", "--subject", "a", "x"), "--subject is for --topic"),
        (("queue", "seek", "sensors", "--to", "soon"), "not found"),
    ):
        result = ignis(*args)
        line = result.error_line()
        assert words in line, line
        assert result.code == (3 if words == "not found" else 2), (args, result.code)
    bad = tmp_path / "bad.yaml"
    bad.write_text(MANIFESTS.replace("shards: 4", "shards: 0"))
    result = ignis("topic", "apply", "-f", str(bad))
    assert result.code == 2 and "shards" in result.err
    unknown = ignis("publish", "--topic", "nosuch", "--subject", "a", "x")
    assert unknown.code == 3 and "topic 'nosuch' not found" in unknown.error_line()


def test_up_syncs_topics_before_the_subscriptions_that_read_them(tmp_path: Path) -> None:
    """`ignis operator --manifests DIR --once` (what `ignis up` runs) applies IgnisTopic documents first."""
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    # The subscription's file sorts first: the topic must still be there before it.
    (manifests / "a-subscription.yaml").write_text(MANIFESTS.split("---\n")[1])
    (manifests / "b-topic.yaml").write_text(MANIFESTS.split("---\n")[0])
    env = {"IGNIS_STORE": f"lmdb://{tmp_path}/store?durability=fast", "PATH": "/usr/bin:/bin"}
    done = subprocess.run([str(IGNIS), "operator", "--manifests", str(manifests), "--once", "-o", "json"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    results = {r["name"]: r for r in json.loads(done.stdout)}
    assert results["sensors"]["ready"] and results["temps"]["ready"], results
    assert results["sensors"]["message"] == "topic record created"

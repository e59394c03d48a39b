"""The pipeline jobs (export, replay, redrive, stats) as functions over the shared SparkSession, and the
`ignis pipeline` CLI itself in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from ignis_pipeline.jobs.export import export
from ignis_pipeline.jobs.gate import CanaryFailed
from ignis_pipeline.jobs.redrive import redrive
from ignis_pipeline.jobs.replay import replay
from ignis_pipeline.jobs.stats import stats

from ignis import Ignis
from ignis.errors import InvalidInputError

IGNIS = Path(sys.executable).parent / "ignis"


@pytest.fixture
def store(ignis: Ignis, store_url: str) -> dict[str, str]:
    from ignis_pipeline.options import SourceOptions

    parsed = SourceOptions.parse({"store": store_url, "queue": "*", "farmId": ignis.store.farm_id,
                                  "clientId": ignis.client_id})
    return {"store": parsed.store, "farmId": parsed.farm_id, "clientId": parsed.client_id}


def _messages(q: Any) -> dict[str, tuple[Any, ...]]:
    out = {}
    for shard, p in q.main.pointers().items():
        if p.load:
            for _, env in q.store.peek(q.name, shard, 1, p.load):
                out[env.msg_id] = (env.payload, env.codec, env.key, env.headers or None)
    return out


def test_export_then_replay_into_a_new_queue_equals_the_original(spark: Any, store: dict[str, str],
                                                                   make_queue: Any, tmp_path: Path) -> None:
    orders = make_queue("orders", shards=4)
    orders.publish_many([b"bin%d" % i for i in range(30)], headers={"src": "a"})
    orders.publish_many([f"text{i}" for i in range(20)], key="cust-1")
    orders.publish({"json": True}, id="the-json")
    copy = make_queue("copy", shards=2)
    result = export(spark, store, ["orders"], str(tmp_path / "export"))
    assert result["exported"] == 51
    written = list((tmp_path / "export" / "queue=orders" / "magazine=main").glob("*.parquet"))
    # 4 shards = 4 slot ranges, written by as many tasks as Spark runs at once (local[2]: 2 files)
    assert 1 <= len(written) <= spark.sparkContext.defaultParallelism < 4
    done = replay(spark, store, str(tmp_path / "export"), "copy")
    assert done["published"] == 51
    assert _messages(copy) == _messages(orders)
    with pytest.raises(InvalidInputError, match="already exists: add --overwrite to replace it"):
        export(spark, store, ["orders"], str(tmp_path / "export"))
    assert export(spark, store, ["orders"], str(tmp_path / "export"), overwrite=True)["exported"] == 51


def test_export_of_an_empty_queue_exports_nothing(spark: Any, store: dict[str, str], make_queue: Any,
                                                  tmp_path: Path) -> None:
    make_queue("quiet", shards=2)
    for fmt in ("parquet", "json"):
        assert export(spark, store, ["quiet"], str(tmp_path / fmt), fmt=fmt)["exported"] == 0


def test_export_job_settings_write_every_row_once_past_the_open_file_limit(
        spark: Any, store: dict[str, str], make_queue: Any, tmp_path: Path) -> None:
    # The export job's session writes without sorting: a task keeps a file open per directory, and past
    # maxConcurrentOutputFileWriters (4) sorts the rest. Ten queues in two tasks pass that limit.
    from ignis_pipeline.jobs.export import SESSION_CONF, read_export

    names = [f"q{i}" for i in range(10)]
    for i, name in enumerate(names):
        make_queue(name, shards=1).publish_many([b"%s-%d" % (name.encode(), n) for n in range(i + 1)])
    before = {key: spark.conf.get(key, None) for key in SESSION_CONF}
    for key, value in SESSION_CONF.items():
        spark.conf.set(key, value)
    try:
        assert export(spark, store, names, str(tmp_path / "e"))["exported"] == 55
    finally:
        for key, value in before.items():
            spark.conf.unset(key) if value is None else spark.conf.set(key, value)
    rows = read_export(spark, str(tmp_path / "e")).select("queue", "payload").collect()
    assert sorted((r.queue, r.payload) for r in rows) == sorted(
        (name, b"%s-%d" % (name.encode(), n)) for i, name in enumerate(names) for n in range(i + 1))


def test_export_parquet_layout_has_no_payload_dictionary_or_statistics(
        spark: Any, store: dict[str, str], make_queue: Any, tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    make_queue("layout", shards=2).publish_many([b"payload-%d" % (i % 3) for i in range(50)])  # repeats
    export(spark, store, ["layout"], str(tmp_path / "e"))
    files = list((tmp_path / "e" / "queue=layout" / "magazine=main").glob("*.parquet"))
    assert files
    for file in files:
        meta = pq.ParquetFile(file).metadata
        names = [meta.schema.column(i).path for i in range(meta.num_columns)]
        for group in range(meta.num_row_groups):
            columns = {name: meta.row_group(group).column(i) for i, name in enumerate(names)}
            assert not columns["payload"].is_stats_set or not columns["payload"].statistics.has_min_max
            assert not any("DICTIONARY" in e for e in columns["payload"].encodings), columns["payload"].encodings
            assert columns["slot"].statistics.has_min_max  # the other columns keep theirs
            assert any("DICTIONARY" in e for e in columns["codec"].encodings)
            # (The ids' and slots' settings leave no trace to check: unique values, so parquet-mr itself
            # drops their dictionary, after building it for the first page.)


def test_replay_where_and_rate(spark: Any, store: dict[str, str], make_queue: Any, tmp_path: Path) -> None:
    src = make_queue("src", shards=2)
    src.publish_many([b"a%d" % i for i in range(40)], key="k1")
    src.publish_many([b"b%d" % i for i in range(40)], key="k2")
    dst = make_queue("dst", shards=2)
    export(spark, store, ["src"], str(tmp_path / "e"))
    import time

    began = time.monotonic()
    done = replay(spark, store, str(tmp_path / "e"), "dst", where="key = 'k2'", rate=40)
    assert done["published"] == 40
    assert time.monotonic() - began >= 0.9  # 40 messages at 40/s: about a second of publishing
    assert sorted(p for p, *_ in _messages(dst).values()) == sorted(b"b%d" % i for i in range(40))


def test_canary_that_is_not_acked_stops_the_replay(spark: Any, store: dict[str, str], make_queue: Any,
                                                    tmp_path: Path) -> None:
    make_queue("from", shards=2).publish_many([b"x%d" % i for i in range(20)])
    target = make_queue("nobody-consumes", shards=2)
    export(spark, store, ["from"], str(tmp_path / "e"))
    with pytest.raises(CanaryFailed, match="canary of 5: 0 acked") as caught:
        replay(spark, store, str(tmp_path / "e"), "nobody-consumes", canary=5, canary_timeout=2)
    assert caught.value.report.pending == 5
    assert target.stats().published == 5  # the rest was never published


def test_canary_that_is_acked_lets_the_replay_go_on(spark: Any, store: dict[str, str], make_queue: Any,
                                                     tmp_path: Path) -> None:
    make_queue("from", shards=2).publish_many([b"x%d" % i for i in range(20)])
    target = make_queue("consumed", shards=2)
    export(spark, store, ["from"], str(tmp_path / "e"))
    stop = threading.Event()

    def consume() -> None:
        while not stop.is_set():
            got = target.fire_many(100)
            if got:
                target.ack(got)
            stop.wait(0.05)

    worker = threading.Thread(target=consume, daemon=True)
    worker.start()
    try:
        done = replay(spark, store, str(tmp_path / "e"), "consumed", canary=5, canary_timeout=60)
    finally:
        stop.set()
        worker.join(5)
    assert done["published"] == 20
    assert done["canary"]["acked"] == 5 and done["canary"]["passed"]


def test_redrive_where_moves_exactly_the_matching_dead_letters(spark: Any, store: dict[str, str],
                                                               make_queue: Any) -> None:
    q = make_queue("work", shards=2, maxDeliveries=1)
    q.publish_many([b"t%d" % i for i in range(6)], headers={"kind": "t"})
    q.publish_many([b"o%d" % i for i in range(9)])
    for m in q.fire_many(20):
        q.nack([m], "timeout" if m.data.startswith(b"t") else "rejected")  # maxDeliveries 1: dead letters
    timeouts = {env.msg_id for _, env in q.dead.browse(100) if env.reason == "timeout"}
    assert len(timeouts) == 6 and q.stats().dead == 15

    done = redrive(spark, store, "work", "dead", where="reason = 'timeout'")
    assert done["moved"] == 6 and done["gone"] == 0
    main = {env.msg_id: env for _, env in q.main.browse(100)}
    assert set(main) == timeouts  # ids kept
    assert {env.attempts for env in main.values()} == {0}  # attempts reset
    assert {env.headers["kind"] for env in main.values()} == {"t"}
    assert {env.reason for _, env in q.dead.browse(100)} == {"rejected"}
    assert len(q.dead.browse(100)) == 9
    again = redrive(spark, store, "work", "dead", where="reason = 'timeout'")
    assert again["moved"] == 0  # each moved exactly once


@pytest.mark.parametrize("source", ["dead", "sideline"])
def test_after_a_redrive_every_figure_agrees(spark: Any, store: dict[str, str], make_queue: Any,
                                             source: str) -> None:
    """The pipeline's redrive moves chosen messages out of slots no claim reached: `ignis stats`, the
    library's browse and `ignis pipeline stats` still count the same messages, in both magazines."""
    q = make_queue("agree", shards=2, maxDeliveries=1 if source == "dead" else 5)
    q.publish_many([b"t%d" % i for i in range(12)], headers={"kind": "t"})
    q.publish_many([b"o%d" % i for i in range(12)])
    for m in q.fire_many(30):
        q.nack([m], "timeout" if m.data.startswith(b"t") else "rejected")
    magazine = q.dead if source == "dead" else q.sideline

    def library() -> int:
        figures = q.stats()
        return figures.dead if source == "dead" else figures.sidelined

    assert library() == len(magazine.browse(100)) == 24
    done = redrive(spark, store, "agree", source, where="reason = 'timeout'")
    assert done["moved"] == 12
    rows = {r["magazine"]: r for r in stats(spark, store, ["agree"])["magazines"]}
    assert library() == len(magazine.browse(100)) == rows[source]["depth"] == rows[source]["stored"] == 12
    assert q.stats().depth == rows["main"]["depth"] == 12
    # Taking what is left passes the emptied slots and the figures stay right.
    assert len(magazine.fire(100)) == 12 and library() == 0


def test_stats_and_plot(spark: Any, store: dict[str, str], make_queue: Any, tmp_path: Path) -> None:
    from ignis_pipeline.jobs.plot import plot

    q = make_queue("backlog", shards=2, maxDeliveries=3)
    q.publish_many([b"a"] * 10, key="hot")
    q.publish_many([b"b"] * 5)
    q.nack(q.fire_many(3), "timeout")
    q.publish_many([b"c"] * 4, delay=600)  # delayed: counted apart, in no magazine's depth
    doc = stats(spark, store, ["backlog"])
    rows = {r["magazine"]: r for r in doc["magazines"]}
    assert rows["main"]["stored"] == 12 and rows["sideline"]["stored"] == 3
    assert rows["main"]["delayed"] == 4 == q.stats().delayed
    assert (rows["main"]["depth"], rows["main"]["inFlight"]) == (12, 0)  # the 3 fired were nacked: none in flight
    assert rows["main"]["depth"] == q.stats().depth and rows["sideline"]["depth"] == q.stats().sidelined
    assert rows["sideline"]["reasons"] == {"timeout": 3}
    assert rows["main"]["attempts"] == {"0": 12}
    assert sum(rows["main"]["shards"].values()) == 12
    assert rows["main"]["topKeys"][0]["key"] == "hot"
    assert rows["main"]["oldestAgeSeconds"] >= 0 and rows["main"]["ageSeconds"]["p99"] is not None
    png = plot(doc, tmp_path / "backlog.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_stats_with_no_queue_named_is_every_queue_of_the_client(spark: Any, store: dict[str, str],
                                                               make_queue: Any) -> None:
    """Issue 45: every queue has its main row, whether it stores messages or none (one holds only delayed
    messages); an empty store has none. (When no queue stored a message it failed with "option queue is missing",
    after the whole Spark job: the delayed counts were read for the queues found in the rows, none.)"""
    assert stats(spark, store, [])["magazines"] == []
    make_queue("full", shards=2).publish_many([b"x"] * 3)
    make_queue("empty", shards=2)
    make_queue("later", shards=2).publish_many([b"y"] * 2, delay=600)

    def rows(queues: list[str]) -> list[tuple[Any, ...]]:
        return [(r["queue"], r["magazine"], r["stored"], r["depth"], r["delayed"])
                for r in stats(spark, store, queues)["magazines"]]

    assert rows([]) == [("empty", "main", 0, 0, 0), ("full", "main", 3, 3, 0), ("later", "main", 0, 0, 2)]
    assert rows(["later", "empty"]) == [("empty", "main", 0, 0, 0), ("later", "main", 0, 0, 2)]


def test_cli_pipeline_stats_json_in_a_subprocess(ignis: Ignis, store_url: str, make_queue: Any,
                                                tmp_path: Path) -> None:
    if not store_url.startswith("lmdb:"):
        pytest.skip("one CLI run is enough")
    make_queue("cli", shards=2).publish_many([b"x"] * 7)
    env = {**os.environ, "IGNIS_STORE": store_url, "IGNIS_CLIENT_ID": ignis.client_id}
    proc = subprocess.run([str(IGNIS), "pipeline", "--master", "local[1]", "--conf", "spark.ui.enabled=false",
                           "stats", "cli", "-o", "json", "--plot", str(tmp_path / "s.png")],
                          capture_output=True, env=env, timeout=240)
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    doc = json.loads(proc.stdout)
    assert [(r["magazine"], r["stored"], r["depth"]) for r in doc["magazines"]] == [("main", 7, 7)]
    assert (tmp_path / "s.png").exists()
    assert proc.stderr.decode() == ""  # (-o json: the plot's path is in the document) nothing of Spark's
    bad = subprocess.run([str(IGNIS), "pipeline", "export", "cli"], capture_output=True, env=env, timeout=60)
    assert bad.returncode == 2 and bad.stderr.decode().startswith("error: --to PATH is required")
    missing = subprocess.run([str(IGNIS), "pipeline", "--conf", "spark.ui.enabled=false", "export", "nope", "--to",
                              str(tmp_path / "never")], capture_output=True, env=env, timeout=240)
    assert missing.returncode == 3
    assert missing.stderr.decode().splitlines()[-1] == ("error: queue 'nope' not found (clientId 'default'); apply "
                                                        "its manifest first")
    assert not (tmp_path / "never").exists()  # nothing was started, nothing half-written
    # The export job as the CLI runs it (its own session settings: no sort before the partitioned write).
    done = subprocess.run([str(IGNIS), "pipeline", "--master", "local[1]", "--conf", "spark.ui.enabled=false",
                           "export", "cli", "--to", str(tmp_path / "out"), "-o", "json"],
                          capture_output=True, env=env, timeout=240)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert json.loads(done.stdout)["exported"] == 7
    assert len(list((tmp_path / "out" / "queue=cli" / "magazine=main").glob("*.parquet"))) == 1


def test_replay_of_an_export_of_every_magazine_publishes_main_rows_unless_asked(
        spark: Any, store: dict[str, str], make_queue: Any, tmp_path: Path) -> None:
    q = make_queue("mixed", shards=2, maxDeliveries=2)
    q.publish_many([b"m%d" % i for i in range(12)])
    q.nack(q.fire_many(3), "timeout")  # attempts 1 < 2: sideline
    for m in q.fire_many(2):
        q.nack([m], "first")
    sidelined = _magazine(q, "mixed_SIDELINE")
    assert len(sidelined) == 5
    export(spark, store, ["mixed"], str(tmp_path / "e"), magazine="all")
    main_ids = set(_messages(q))

    only_main = make_queue("only-main", shards=2)
    done = replay(spark, store, str(tmp_path / "e"), "only-main")
    assert (done["published"], done["leftOut"], done["magazine"]) == (7, 5, "main")
    assert set(_messages(only_main)) == main_ids  # no failed message re-published as a fresh one

    side = make_queue("side", shards=2)
    assert replay(spark, store, str(tmp_path / "e"), "side", magazine="sideline")["published"] == 5
    assert set(_messages(side)) == set(sidelined)
    every = make_queue("every", shards=2)
    done = replay(spark, store, str(tmp_path / "e"), "every", magazine="all")
    assert (done["published"], done["leftOut"]) == (12, 0)
    assert set(_messages(every)) == main_ids | set(sidelined)
    with pytest.raises(InvalidInputError, match="--magazine 'gone'"):
        replay(spark, store, str(tmp_path / "e"), "every", magazine="gone")


def _magazine(q: Any, name: str) -> dict[str, Any]:
    out = {}
    for shard, p in q.store.pointers(name, q.spec.shards).items():
        if p.load:
            out.update({env.msg_id: env for _, env in q.store.peek(name, shard, 1, p.load)})
    return out


def test_the_plot_numbers_shards_0_to_n_minus_1(spark: Any, store: dict[str, str], make_queue: Any) -> None:
    from ignis_pipeline.jobs.plot import figure

    q = make_queue("eight", shards=8, maxDeliveries=3)
    q.publish_many([b"x"] * 80)  # every shard gets some
    q.nack(q.fire_many(5), "timeout")
    doc = stats(spark, store, ["eight"])
    assert sorted(int(s) for s in doc["magazines"][0]["shards"]) == list(range(8))
    fig = figure(doc)
    axis = fig.axes[1]
    low, high = axis.get_xlim()
    drawn = [t for t in axis.get_xticks() if low <= t <= high]
    assert drawn == list(range(8))  # whole shard numbers, and no 8
    two = make_queue("two", shards=2)
    two.publish_many([b"y"] * 4)
    axis = figure(stats(spark, store, ["two"])).axes[1]
    low, high = axis.get_xlim()
    assert [t for t in axis.get_xticks() if low <= t <= high] == [0, 1]  # no 0.5


def test_the_cli_and_the_jobs_do_not_import_each_other() -> None:
    import ast

    import ignis_pipeline

    root = Path(ignis_pipeline.__file__).parent

    def imports(path: Path) -> set[str]:
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                found.add(node.module)
                found.update(f"{node.module}.{a.name}" for a in node.names)
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
        return found

    jobs = sorted((root / "jobs").glob("*.py"))
    assert len(jobs) >= 8
    for job in jobs:
        assert not {m for m in imports(job) if m.startswith("ignis_pipeline.cli")}, job.name
    assert not {m for m in imports(root / "runner.py") if m.startswith("ignis_pipeline")}
    assert "ignis_pipeline.runner.run_job" in imports(root / "jobs" / "export.py")


def test_records_that_are_not_messages_are_exported_as_unreadable_and_never_replayed(
        spark: Any, store: dict[str, str], make_queue: Any, tmp_path: Path) -> None:
    q = make_queue("mixed", shards=1)
    refs = q.publish_many([b"a", b"b", b"c"])
    forged = refs[1].ref  # another tool overwrote it (the lmdb internals / the raw client)
    if hasattr(q.store, "client"):
        q.store.client.put(q.store._ctx.data_key(forged), {"payload": 12345, "msgId": "x", "loadedAt": 1},
                           policy={"exists": 3, "ttl": -2})
    else:
        with q.store._ctx.env.env.begin(write=True) as txn:
            txn.put(q.store._ctx.data_key(forged), b"\x00\x01", db=q.store._ctx.data)
    done = export(spark, store, ["mixed"], str(tmp_path / "e"))
    assert done["exported"] == 3
    codecs = sorted(r.codec for r in spark.read.parquet(str(tmp_path / "e")).collect())
    assert codecs == ["bytes", "bytes", "unreadable"]
    make_queue("mixed-copy", shards=1)
    replayed = replay(spark, store, str(tmp_path / "e"), "mixed-copy")
    assert (replayed["published"], replayed["unreadable"]) == (2, 1)

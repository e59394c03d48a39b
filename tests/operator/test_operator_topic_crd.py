"""The IgnisTopic CRD: a valid structural schema, limits and defaults identical to TopicSpec, printer columns,
every status field the operator writes declared, and admission (schema + CEL) checked against a table of valid
and invalid manifests, as test_operator_crd.py does for IgnisQueue."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import cel
import pytest
import yaml
from admission import ROOT, admit, apply_defaults, cel_errors, crd, rules, schema
from ignis_operator.reconcile import SYNCED, SyncResult, status_for
from ignis_operator.topics import TOPIC_FIGURES, topic_figures_status
from jsonschema import Draft7Validator
from test_operator_crd import _compare, _nodes

from ignis.errors import InvalidSpecError
from ignis.topics.spec import MAX_RETENTION_BYTES, TopicSpec

KIND = "IgnisTopic"
EXAMPLES = sorted((ROOT / "examples" / "topics").glob("*.yaml"))


def topic(name: str = "events", namespace: str | None = "shop", **spec: Any) -> dict[str, Any]:
    metadata = {"name": name, **({"namespace": namespace} if namespace else {})}
    return {"apiVersion": "ignismq.io/v1alpha1", "kind": KIND, "metadata": metadata, "spec": spec}


def test_crd_names_scope_and_version() -> None:
    doc = crd(KIND)
    spec = doc["spec"]
    assert doc["metadata"]["name"] == f"{spec['names']['plural']}.{spec['group']}" == "ignistopics.ignismq.io"
    assert spec["scope"] == "Namespaced"
    assert spec["names"] == {"kind": "IgnisTopic", "listKind": "IgnisTopicList", "plural": "ignistopics",
                             "singular": "ignistopic", "shortNames": ["it"], "categories": ["ignis"]}
    (version,) = spec["versions"]
    queue_version = crd("IgnisQueue")["spec"]["versions"][0]
    assert (version["name"], spec["group"]) == (queue_version["name"], crd("IgnisQueue")["spec"]["group"])
    assert version["served"] and version["storage"] and version["subresources"] == {"status": {}}


def test_printer_columns() -> None:
    """`kubectl get ignistopics`: shards, retention, messages, subscriptions, age (bytes and published: -o wide)."""
    (version,) = crd(KIND)["spec"]["versions"]
    columns = {c["name"]: c for c in version["additionalPrinterColumns"]}
    default = [name for name, c in columns.items() if "priority" not in c]
    assert default == ["Shards", "Retention", "Messages", "Subscriptions", "Ready", "Reason", "Age"]
    assert {name for name, c in columns.items() if c.get("priority") == 1} == {"Bytes", "Published"}
    assert columns["Messages"]["jsonPath"] == ".status.retained"
    assert columns["Subscriptions"]["jsonPath"] == ".status.subscriptions"
    assert columns["Age"] == {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}
    props = schema(KIND)["properties"]
    for column in columns.values():
        if column["jsonPath"].startswith((".spec.", ".status.")) and "[" not in column["jsonPath"]:
            _, part, field = column["jsonPath"].split(".")
            assert field in props[part]["properties"], column["jsonPath"]
            assert column["type"] == props[part]["properties"][field]["type"], column["jsonPath"]


def test_every_status_field_the_operator_writes_is_in_the_schema() -> None:
    """The API server prunes undeclared fields silently: each one the operator writes must be declared."""
    status_schema = schema(KIND)["properties"]["status"]
    result = SyncResult("events", "shop", True, SYNCED, "topic record created", created=True)
    figures = {**dict.fromkeys(TOPIC_FIGURES, 7), "oldestAgeSeconds": 3, "subscriptionNames": ["a", "b"]}
    status = {**status_for(result, None, 2), **topic_figures_status(figures)}
    assert set(status) <= set(status_schema["properties"]), set(status) - set(status_schema["properties"])
    Draft7Validator(status_schema).validate(status)


def test_schema_is_structural() -> None:
    root = schema(KIND)
    Draft7Validator.check_schema(root)
    for path, node in _nodes(root):
        assert "type" in node, f"{path or '<root>'}: every node needs a type"
        assert not {"$ref", "definitions", "dependencies", "additionalItems", "patternProperties"} & set(node), path
        if "default" in node:
            value = apply_defaults(node, node["default"])
            assert not list(Draft7Validator(node).iter_errors(value)), f"{path}: invalid default {value!r}"
    assert root["properties"]["metadata"] == {"type": "object"}


def test_every_cel_rule_compiles_and_has_a_message() -> None:
    found = rules(KIND)
    assert len(found) >= 3
    for path, rule in found:
        cel.compile(rule["rule"])
        assert rule.get("message") and len(rule["message"]) > 20, f"{path}: rule without a human message"


def test_crd_fields_limits_and_defaults_match_topic_spec() -> None:
    _compare(TopicSpec, schema(KIND)["properties"]["spec"], "spec", skip={"name"})


def test_defaulted_objects_equal_topic_spec_defaults() -> None:
    """A topic with no spec at all is a topic with every default (the spec itself defaults to {})."""
    for doc in (topic(), {k: v for k, v in topic().items() if k != "spec"}):
        defaulted = apply_defaults(schema(KIND), doc)
        assert defaulted["spec"] == {"shards": 32, "retentionSeconds": 604800, "deletionPolicy": "Retain"}
        assert TopicSpec.from_manifest(defaulted) == TopicSpec.from_manifest(topic())


def test_examples_exist_a_topic_and_two_subscriptions() -> None:
    docs = [doc for path in EXAMPLES for doc in yaml.safe_load_all(path.read_text(encoding="utf-8"))]
    topics = [d for d in docs if d["kind"] == KIND]
    subscriptions = [d for d in docs if d["kind"] == "IgnisQueue" and d["spec"].get("subscribe")]
    assert len(topics) == 1 and len(subscriptions) == 2
    assert {s["spec"]["subscribe"]["topic"] for s in subscriptions} == {topics[0]["metadata"]["name"]}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: Path(p).name)
def test_every_example_is_admitted_and_valid_for_its_spec(path: Path) -> None:
    from ignis.spec import QueueSpec

    for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
        assert admit(doc) == []
        (TopicSpec if doc["kind"] == KIND else QueueSpec).from_manifest(doc)


VALID = [
    ("minimal", topic(), None),
    ("no spec at all", {k: v for k, v in topic().items() if k != "spec"}, None),
    ("limits at their maximum", topic(shards=512, retentionSeconds=31536000, retentionBytes=MAX_RETENTION_BYTES,
                                      clientId="a" * 40, deletionPolicy="Delete"), None),
    ("limits at their minimum", topic(shards=1, retentionSeconds=1, retentionBytes=1), None),
    ("name of 63 characters", topic(name="t" * 63), None),
    ("shards grow", topic(shards=16), topic(shards=8)),
    ("retention shortened", topic(retentionSeconds=60), topic(retentionSeconds=3600)),
    ("byte bound removed", topic(), topic(retentionBytes=1000)),
    ("clientId unchanged", topic(clientId="billing", shards=64), topic(clientId="billing")),
]


@pytest.mark.parametrize(("case", "doc", "old"), VALID, ids=[c[0] for c in VALID])
def test_valid_table(case: str, doc: dict[str, Any], old: dict[str, Any] | None) -> None:
    assert admit(doc, old) == []
    TopicSpec.from_manifest(apply_defaults(schema(KIND), doc))  # TopicSpec agrees


SHRINK = "shards may grow, never shrink: subscriptions would never read the removed shards"
CLIENT_ID = "clientId is immutable: it names the store sets that hold the topic's data; create a new IgnisTopic instead"
CID_PATTERN = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"

INVALID = [
    ("no shards", topic(shards=0), None, [("spec.shards", "0 is less than the minimum of 1")]),
    ("too many shards", topic(shards=513), None, [("spec.shards", "513 is greater than the maximum of 512")]),
    ("shards as a string", topic(shards="8"), None, [("spec.shards", "'8' is not of type 'integer'")]),
    ("retention zero", topic(retentionSeconds=0), None, [("spec.retentionSeconds", "0 is less than the minimum of 1")]),
    ("retention over a year", topic(retentionSeconds=31536001), None,
     [("spec.retentionSeconds", "31536001 is greater than the maximum of 31536000")]),
    ("byte bound zero", topic(retentionBytes=0), None, [("spec.retentionBytes", "0 is less than the minimum of 1")]),
    ("byte bound over a PiB", topic(retentionBytes=MAX_RETENTION_BYTES + 1), None,
     [("spec.retentionBytes", f"{MAX_RETENTION_BYTES + 1} is greater than the maximum of {MAX_RETENTION_BYTES}")]),
    ("byte bound as a unit string", topic(retentionBytes="10Gi"), None,
     [("spec.retentionBytes", "'10Gi' is not of type 'integer'")]),
    ("unknown deletionPolicy", topic(deletionPolicy="Purge"), None,
     [("spec.deletionPolicy", "'Purge' is not one of ['Retain', 'Delete']")]),
    ("clientId in capitals", topic(clientId="Billing"), None,
     [("spec.clientId", f"'Billing' does not match '{CID_PATTERN}'")]),
    ("clientId too long", topic(clientId="c" * 41), None, [("spec.clientId", f"'{'c' * 41}' is too long")]),
    ("name over 63 characters", topic(name="t" * 64), None,
     [("", "metadata.name is the topic name and may be at most 63 characters")]),
    ("shards shrink", topic(shards=8), topic(shards=16), [("spec.shards", SHRINK)]),
    ("shards shrink to the default", topic(), topic(shards=64), [("spec.shards", SHRINK)]),
    ("clientId changed", topic(clientId="b"), topic(clientId="a"), [("spec", CLIENT_ID)]),
    ("clientId removed", topic(), topic(clientId="a"), [("spec", CLIENT_ID)]),
    ("clientId added", topic(clientId="a"), topic(), [("spec", CLIENT_ID)]),
]
LAX = {"shards as a string"}  # TopicSpec (pydantic, lax mode) coerces "8"; the API server is strict


@pytest.mark.parametrize(("case", "doc", "old", "expected"), INVALID, ids=[c[0] for c in INVALID])
def test_invalid_table(case: str, doc: dict[str, Any], old: dict[str, Any] | None,
                       expected: list[tuple[str, str]]) -> None:
    assert admit(doc, old) == sorted(expected)
    if old is None and case not in LAX:
        with pytest.raises(InvalidSpecError):
            TopicSpec.from_manifest(doc)


def test_transition_rules_do_not_run_on_create() -> None:
    assert cel_errors(apply_defaults(schema(KIND), topic(shards=1))) == []

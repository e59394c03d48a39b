"""The IgnisQueue CRD: a valid apiextensions.k8s.io/v1 structural schema, limits and defaults identical
to QueueSpec, and admission (schema + CEL) checked against a table of valid and invalid manifests."""

from __future__ import annotations

import copy
import re
from enum import StrEnum
from pathlib import Path
from typing import Any

import annotated_types
import cel
import pytest
import yaml
from admission import ROOT, admit, apply_defaults, cel_errors, crd, rules, schema
from ignis_operator.reconcile import (
    AGE_FIGURE,
    FIGURES,
    FULL_FIGURE,
    SYNCED,
    SyncResult,
    figures_status,
    status_for,
)
from jsonschema import Draft7Validator
from pydantic import BaseModel
from pydantic.alias_generators import to_camel

from ignis.errors import InvalidSpecError
from ignis.spec import BatchingSpec, QueueSpec

EXAMPLES = sorted((ROOT / "examples" / "queues").glob("*.yaml"))


def manifest(name: str = "orders", namespace: str | None = "shop", **spec: Any) -> dict[str, Any]:
    spec.setdefault("handlerType", "orders.v1")
    metadata = {"name": name, **({"namespace": namespace} if namespace else {})}
    return {"apiVersion": "ignismq.io/v1alpha1", "kind": "IgnisQueue", "metadata": metadata, "spec": spec}


def without(doc: dict[str, Any], *path: str) -> dict[str, Any]:
    doc = copy.deepcopy(doc)
    node = doc
    for part in path[:-1]:
        node = node[part]
    del node[path[-1]]
    return doc


# ---- the CRD itself ---------------------------------------------------------------------------------
def test_crd_names_scope_and_version() -> None:
    doc = crd()
    assert doc["apiVersion"] == "apiextensions.k8s.io/v1" and doc["kind"] == "CustomResourceDefinition"
    spec = doc["spec"]
    assert doc["metadata"]["name"] == f"{spec['names']['plural']}.{spec['group']}" == "ignisqueues.ignismq.io"
    assert spec["scope"] == "Namespaced"
    assert spec["names"] == {"kind": "IgnisQueue", "listKind": "IgnisQueueList", "plural": "ignisqueues",
                             "singular": "ignisqueue", "shortNames": ["iq"], "categories": ["ignis"]}
    (version,) = spec["versions"]
    assert version["name"] == "v1alpha1" and version["served"] and version["storage"]
    assert version["subresources"] == {"status": {}}


def test_printer_columns() -> None:
    (version,) = crd()["spec"]["versions"]
    columns = {c["name"]: c for c in version["additionalPrinterColumns"]}
    assert list(columns) == ["Shards", "Concurrency", "Depth", "Oldest", "Sidelined", "Full%", "Delayed", "Ordered",
                             "Ready", "Reason", "Age"]
    assert columns["Full%"]["jsonPath"] == ".status.fullPercent" and columns["Full%"]["type"] == "integer"
    assert columns["Oldest"]["jsonPath"] == ".status.oldestAgeSeconds" and "priority" not in columns["Oldest"]
    assert columns["Delayed"]["priority"] == 1  # kubectl get -o wide
    assert columns["Ordered"] == {**columns["Ordered"], "jsonPath": ".spec.ordered", "type": "boolean", "priority": 1}
    assert columns["Ready"]["jsonPath"] == '.status.conditions[?(@.type=="Ready")].status'
    assert columns["Reason"]["jsonPath"] == '.status.conditions[?(@.type=="Ready")].reason'
    assert columns["Age"] == {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}
    for column in columns.values():
        assert column["type"] in {"integer", "number", "string", "boolean", "date"}
        assert column["jsonPath"].startswith(".")
    # every column path points into the schema (a typo would show an empty column forever)
    props = schema()["properties"]
    for column in columns.values():
        if column["jsonPath"].startswith((".spec.", ".status.")) and "[" not in column["jsonPath"]:
            _, part, field = column["jsonPath"].split(".")
            assert field in props[part]["properties"], column["jsonPath"]


def test_every_status_field_the_operator_writes_is_in_the_schema() -> None:
    """The API server prunes fields a structural schema does not declare: a status field missing there would be
    dropped without an error, and its column would stay empty."""
    status_schema = schema()["properties"]["status"]
    result = SyncResult("orders", "shop", True, SYNCED, "queue record created", created=True)
    status = {**status_for(result, None, 3),
              **figures_status({**dict.fromkeys(FIGURES, 7), AGE_FIGURE: 42, FULL_FIGURE: 93})}
    assert set(status) <= set(status_schema["properties"]), set(status) - set(status_schema["properties"])
    Draft7Validator(status_schema).validate(status)
    for key in (*FIGURES, AGE_FIGURE, FULL_FIGURE):
        assert status_schema["properties"][key]["type"] == "integer", key


def _nodes(node: dict[str, Any], path: str = "") -> list[tuple[str, dict[str, Any]]]:
    found = [(path, node)]
    for name, prop in (node.get("properties") or {}).items():
        found += _nodes(prop, f"{path}.{name}")
    if "items" in node:
        found += _nodes(node["items"], f"{path}[]")
    return found


def test_schema_is_structural() -> None:
    """The structural-schema rules of apiextensions.k8s.io/v1 that can be checked offline."""
    root = schema()
    Draft7Validator.check_schema(root)
    for path, node in _nodes(root):
        assert "type" in node or node.get("x-kubernetes-int-or-string") or node.get(
            "x-kubernetes-preserve-unknown-fields"), f"{path or '<root>'}: every node needs a type"
        assert not {"$ref", "definitions", "dependencies", "additionalItems", "patternProperties"} & set(node), path
        assert not ("additionalProperties" in node and "properties" in node), path
        if node.get("x-kubernetes-list-type") == "map":
            keys = node["x-kubernetes-list-map-keys"]
            assert set(keys) <= set(node["items"].get("required", [])), f"{path}: list-map keys must be required"
        if "default" in node:
            # defaults must themselves be valid (after their own defaulting), or the API server refuses the CRD
            value = apply_defaults(node, node["default"])
            assert not list(Draft7Validator(node).iter_errors(value)), f"{path}: invalid default {value!r}"
    # metadata may only be constrained in name/generateName; we leave it to the API server
    assert root["properties"]["metadata"] == {"type": "object"}


def test_every_cel_rule_compiles_and_has_a_message() -> None:
    found = rules()
    assert len(found) >= 5
    for path, rule in found:
        cel.compile(rule["rule"])
        assert rule.get("message") and len(rule["message"]) > 20, f"{path}: rule without a human message"


# ---- the CRD agrees with QueueSpec ----------------------------------------------------------------------
_TYPES = {int: "integer", float: "number", str: "string", bool: "boolean"}


def _constraints(field: Any) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for m in field.metadata:
        if isinstance(m, annotated_types.Ge):
            found["minimum"] = m.ge
        elif isinstance(m, annotated_types.Le):
            found["maximum"] = m.le
        elif isinstance(m, annotated_types.MinLen):
            found["minLength"] = m.min_length
        elif isinstance(m, annotated_types.MaxLen):
            found["maxLength"] = m.max_length
        elif getattr(m, "pattern", None):
            found["pattern"] = m.pattern
    return found


def _compare(model: type[BaseModel], node: dict[str, Any], path: str, skip: set[str] = frozenset()) -> None:
    fields = {to_camel(name): f for name, f in model.model_fields.items() if name not in skip}
    props = node["properties"]
    assert set(props) == set(fields), f"{path}: CRD fields {sorted(props)} != QueueSpec fields {sorted(fields)}"
    required = {alias for alias, f in fields.items() if f.is_required()}
    if model is BatchingSpec:  # both-or-neither is a CEL rule there, so the API server gives a human message
        assert any("has(self.maxBatchSize) == has(self.maxWaitSeconds)" in r["rule"]
                   for r in node["x-kubernetes-validations"])
    else:
        assert set(node.get("required", [])) == required, path
    for alias, f in fields.items():
        prop, where = props[alias], f"{path}.{alias}"
        annotation = f.annotation
        nested = [t for t in getattr(annotation, "__args__", (annotation,)) if isinstance(t, type)
                  and issubclass(t, BaseModel)]
        if nested:
            assert prop["type"] == "object", where
            _compare(nested[0], prop, where)
        elif set(getattr(annotation, "__args__", ())) == {str, int}:  # (subscribe.start: a time or epoch ms)
            assert prop.get("x-kubernetes-int-or-string") is True and "type" not in prop, where
        elif isinstance(annotation, type) and issubclass(annotation, StrEnum):  # deletionPolicy, overflow
            assert prop["type"] == "string" and prop["enum"] == [p.value for p in annotation], where
        else:
            base = next(t for t in getattr(annotation, "__args__", (annotation,)) if t is not type(None))
            assert prop["type"] == _TYPES[base], where
        for key, value in _constraints(f).items():
            assert prop.get(key) == value, f"{where}: {key} is {prop.get(key)!r} in the CRD, {value!r} in QueueSpec"
        for key in ("minimum", "maximum", "minLength", "maxLength", "pattern"):
            assert key not in prop or key in _constraints(f), f"{where}: {key} only in the CRD"
        if f.is_required() or (f.default is None and f.default_factory is None):
            assert "default" not in prop, f"{where}: no default in QueueSpec"
        elif f.default_factory is not None:
            assert apply_defaults(prop, prop["default"]) == f.default_factory().model_dump(by_alias=True), where
        else:
            default = f.default.value if isinstance(f.default, StrEnum) else f.default
            assert prop.get("default") == default, f"{where}: default {prop.get('default')!r} != {default!r}"


def test_crd_fields_limits_and_defaults_match_queue_spec() -> None:
    _compare(QueueSpec, schema()["properties"]["spec"], "spec", skip={"name"})


def test_defaulted_minimal_object_equals_queue_spec_defaults() -> None:
    doc = apply_defaults(schema(), manifest(handlerType="x"))
    assert QueueSpec.from_manifest(doc) == QueueSpec.from_manifest(manifest(handlerType="x"))


def test_queue_spec_patterns_match_the_crd_patterns() -> None:
    props = schema()["properties"]["spec"]["properties"]
    for alias in ("handlerType", "clientId"):
        pattern = re.compile(props[alias]["pattern"])
        assert pattern.match("a.b") if alias == "handlerType" else pattern.match("a-b")


# ---- admission table ------------------------------------------------------------------------------
def test_examples_exist() -> None:
    assert len(EXAMPLES) >= 3


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: Path(p).name)
def test_every_example_is_admitted_and_valid_for_queue_spec(path: Path) -> None:
    for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
        assert admit(doc) == []
        QueueSpec.from_manifest(doc)


VALID = [
    ("minimal", manifest(), None),
    ("ordered", manifest(ordered=True), None),
    ("ordered kept", manifest(ordered=True, shards=64), manifest(ordered=True)),
    ("ordered false, as the default", manifest(ordered=False), manifest()),
    ("limits at their maximum", manifest(shards=512, queueExpirySeconds=31536000, messageExpirySeconds=31536000,
                                         concurrency=100, sweepDurationSeconds=18000, maxDeliveries=1000,
                                         handlerTimeoutSeconds=1800, clientId="a" * 40, handlerType="h" * 100,
                                         shovel={"concurrency": 50, "intervalSeconds": 86400},
                                         batching={"maxBatchSize": 200000, "maxWaitSeconds": 300}), None),
    ("limits at their minimum", manifest(shards=1, queueExpirySeconds=1, messageExpirySeconds=1, concurrency=0,
                                         sweepDurationSeconds=300, maxDeliveries=0, handlerTimeoutSeconds=1,
                                         shovel={"enabled": False, "concurrency": 1, "intervalSeconds": 0},
                                         batching={"maxBatchSize": 2, "maxWaitSeconds": 1}), None),
    ("queue expiry equal to message expiry", manifest(queueExpirySeconds=3600, messageExpirySeconds=3600), None),
    ("name of 63 characters", manifest(name="q" * 63), None),
    ("shards grow", manifest(shards=16), manifest(shards=8)),
    ("shards unchanged, other fields edited", manifest(shards=8, concurrency=9), manifest(shards=8)),
    ("clientId unchanged", manifest(clientId="billing", concurrency=3), manifest(clientId="billing")),
    ("clientId still absent", manifest(concurrency=3), manifest()),
    ("batching removed", manifest(), manifest(batching={"maxBatchSize": 10, "maxWaitSeconds": 1})),
    ("a subscription", manifest(subscribe={"topic": "events", "filter": "sensors/+/temp", "start": "earliest"}),
     None),
    ("a subscription from a time", manifest(subscribe={"topic": "events", "start": "2026-11-28T12:00:00Z"}), None),
    ("a subscription from epoch ms", manifest(subscribe={"topic": "events", "start": 1795870000000}), None),
    ("a subscription's filter edited", manifest(subscribe={"topic": "events", "filter": "a/#"}),
     manifest(subscribe={"topic": "events"})),
    ("a subscription from a leap day", manifest(subscribe={"topic": "events", "start": "2028-02-29T00:00:00Z"}), None),
    ("a subscription from a time with an offset",
     manifest(subscribe={"topic": "events", "start": "2026-11-28T12:00:00.250+05:30"}), None),
    ("a subscription's start edited (it only matters at creation)",
     manifest(subscribe={"topic": "events", "start": "earliest"}), manifest(subscribe={"topic": "events"})),
    ("a bounded queue", manifest(maxLength=1000, maxBytes=1 << 20, overflow="dropHead"), None),
    ("a bound of one message per shard", manifest(shards=4, maxLength=4), None),
    ("a bound at its maximum", manifest(maxLength=10**12, maxBytes=10**15, overflow="rejectPublish"), None),
    ("a bound raised and its overflow changed", manifest(maxLength=2000, overflow="dropHead"), manifest(maxLength=100)),
    ("a bound removed", manifest(), manifest(maxLength=100)),
]


@pytest.mark.parametrize(("case", "doc", "old"), VALID, ids=[c[0] for c in VALID])
def test_valid_table(case: str, doc: dict[str, Any], old: dict[str, Any] | None) -> None:
    assert admit(doc, old) == []
    QueueSpec.from_manifest(doc)  # QueueSpec agrees


QUEUE_EXPIRY = "queueExpirySeconds must be >= messageExpirySeconds: a queue may not expire before its messages"
BATCHING = "batching needs both maxBatchSize and maxWaitSeconds, or neither (leave batching out)"
SHRINK = "shards may grow, never shrink: messages in removed shards would never be delivered"
CLIENT_ID = "clientId is immutable: it names the store sets that hold the queue's data; create a new IgnisQueue instead"
HT_PATTERN = "^[A-Za-z0-9]([A-Za-z0-9_.:/-]*[A-Za-z0-9])?$"
CID_PATTERN = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"

BOUND_SHARDS = ("maxLength must be >= shards: the bound is split evenly across the shards, and each shard must hold "
                "at least one message")
BYTES_SHARDS = "maxBytes must be >= shards: the bound is split evenly across the shards"
BOUND_SUBSCRIPTION = ("maxLength/maxBytes are for a queue publishers write: a subscription's messages come from its "
                      "topic (bound the topic with retentionBytes)")
SUBSCRIBE_TOPIC = ("subscribe.topic is immutable, and a queue does not become or stop being a subscription: create a "
                   "new IgnisQueue instead")
FILTER = "filter: '+' must be a whole level (sensors/+/temp) and '#' the whole last level (sensors/#)"
FILTER_NUL = "filter: NUL is not allowed in a subject filter (nor in a subject)"
START = "start must be earliest, latest, an RFC 3339 time (2026-11-28T12:00:00Z) or epoch milliseconds"

ORDERED_IMMUTABLE = ("ordered is immutable: a queue's in-flight bookkeeping depends on it; create a new IgnisQueue "
                     "instead")
ORDERED_RULES = "ordered: a subscription or a bounded queue (maxLength/maxBytes) cannot be ordered yet"

INVALID = [
    ("ordered turned on", manifest(ordered=True), manifest(), [("spec", ORDERED_IMMUTABLE)]),
    ("ordered turned off", manifest(ordered=False), manifest(ordered=True), [("spec", ORDERED_IMMUTABLE)]),
    ("ordered left out of an ordered queue", manifest(), manifest(ordered=True), [("spec", ORDERED_IMMUTABLE)]),
    ("ordered and bounded", manifest(ordered=True, maxLength=100), None, [("spec", ORDERED_RULES)]),
    ("ordered as a string", manifest(ordered="yes"), None, [("spec.ordered", "'yes' is not of type 'boolean'")]),
    ("maxLength zero", manifest(shards=1, maxLength=0), None, [("spec.maxLength", "0 is less than the minimum of 1")]),
    ("maxLength negative", manifest(shards=1, maxLength=-5), None,
     [("spec.maxLength", "-5 is less than the minimum of 1")]),
    ("maxLength over its maximum", manifest(maxLength=10**12 + 1), None,
     [("spec.maxLength", f"{10**12 + 1} is greater than the maximum of {10**12}")]),
    ("maxLength as a string", manifest(maxLength="100"), None, [("spec.maxLength", "'100' is not of type 'integer'")]),
    ("maxLength under the shards", manifest(shards=8, maxLength=7), None, [("spec", BOUND_SHARDS)]),
    ("maxLength under the default shards", manifest(maxLength=10), None, [("spec", BOUND_SHARDS)]),
    ("shards grown past maxLength", manifest(shards=64, maxLength=40), manifest(shards=32, maxLength=40),
     [("spec", BOUND_SHARDS)]),
    ("maxBytes zero", manifest(shards=1, maxBytes=0), None, [("spec.maxBytes", "0 is less than the minimum of 1")]),
    ("maxBytes under the shards", manifest(shards=8, maxBytes=4), None, [("spec", BYTES_SHARDS)]),
    ("maxBytes over its maximum", manifest(maxBytes=10**15 + 1), None,
     [("spec.maxBytes", f"{10**15 + 1} is greater than the maximum of {10**15}")]),
    ("unknown overflow", manifest(maxLength=100, overflow="dropTail"), None,
     [("spec.overflow", "'dropTail' is not one of ['rejectPublish', 'dropHead']")]),
    ("overflow in lowercase", manifest(maxLength=100, overflow="reject-publish"), None,
     [("spec.overflow", "'reject-publish' is not one of ['rejectPublish', 'dropHead']")]),
    ("a bounded subscription", manifest(subscribe={"topic": "events"}, maxLength=100), None,
     [("spec", BOUND_SUBSCRIPTION)]),
    ("a filter with # in the middle", manifest(subscribe={"topic": "events", "filter": "a/#/b"}), None,
     [("spec.subscribe.filter", FILTER)]),
    ("a filter with a partial +", manifest(subscribe={"topic": "events", "filter": "a+"}), None,
     [("spec.subscribe.filter", FILTER)]),
    ("a start that is no time", manifest(subscribe={"topic": "events", "start": "soon"}), None,
     [("spec.subscribe.start", START)]),
    ("a negative start", manifest(subscribe={"topic": "events", "start": -1}), None,
     [("spec.subscribe.start", START)]),
    ("a filter with NUL", manifest(subscribe={"topic": "events", "filter": "a/\0"}), None,
     [("spec.subscribe.filter", FILTER_NUL)]),
    ("a filter too long", manifest(subscribe={"topic": "events", "filter": "a" * 256}), None,
     [("spec.subscribe.filter", f"'{'a' * 256}' is too long")]),
    ("an empty filter", manifest(subscribe={"topic": "events", "filter": ""}), None,
     [("spec.subscribe.filter", "'' should be non-empty")]),
    ("a start on a day that does not exist", manifest(subscribe={"topic": "events", "start": "2026-02-30T00:00:00Z"}),
     None, [("spec.subscribe.start", START)]),
    ("a start on a leap day of a common year",
     manifest(subscribe={"topic": "events", "start": "2100-02-29T00:00:00Z"}), None, [("spec.subscribe.start", START)]),
    ("a start in month 13", manifest(subscribe={"topic": "events", "start": "2026-13-01T00:00:00Z"}), None,
     [("spec.subscribe.start", START)]),
    ("a start at hour 24", manifest(subscribe={"topic": "events", "start": "2026-11-28T24:00:00Z"}), None,
     [("spec.subscribe.start", START)]),
    ("a start as a boolean", manifest(subscribe={"topic": "events", "start": True}), None,
     [("spec.subscribe.start", "True is not of type 'integer', 'string'")]),
    ("a subscription's topic with a capital", manifest(subscribe={"topic": "Events"}), None,
     [("spec.subscribe.topic", "'Events' does not match '^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$'")]),
    ("a subscription's topic removed", manifest(), manifest(subscribe={"topic": "events"}),
     [("spec", SUBSCRIBE_TOPIC)]),
    ("a subscription without its topic", manifest(subscribe={"filter": "#"}), None,
     [("spec.subscribe", "'topic' is a required property")]),
    ("a subscription's topic changed", manifest(subscribe={"topic": "other"}), manifest(subscribe={"topic": "events"}),
     [("spec", SUBSCRIBE_TOPIC)]),
    ("a queue made a subscription", manifest(subscribe={"topic": "events"}), manifest(), [("spec", SUBSCRIBE_TOPIC)]),
    ("no spec", without(manifest(), "spec"), None, [("", "'spec' is a required property")]),
    ("no handlerType", without(manifest(), "spec", "handlerType"), None,
     [("spec", "'handlerType' is a required property")]),
    ("empty handlerType", manifest(handlerType=""), None,
     [("spec.handlerType", "'' does not match '" + HT_PATTERN.replace("\\", "\\\\") + "'"),
      ("spec.handlerType", "'' should be non-empty")]),
    ("handlerType with a space", manifest(handlerType="my handler"), None,
     [("spec.handlerType", f"'my handler' does not match '{HT_PATTERN}'")]),
    ("handlerType too long", manifest(handlerType="h" * 101), None,
     [("spec.handlerType", f"'{'h' * 101}' is too long")]),
    ("clientId in capitals", manifest(clientId="Billing"), None,
     [("spec.clientId", f"'Billing' does not match '{CID_PATTERN}'")]),
    ("clientId too long", manifest(clientId="c" * 41), None, [("spec.clientId", f"'{'c' * 41}' is too long")]),
    ("no shards", manifest(shards=0), None, [("spec.shards", "0 is less than the minimum of 1")]),
    ("too many shards", manifest(shards=513), None, [("spec.shards", "513 is greater than the maximum of 512")]),
    ("shards as a string", manifest(shards="8"), None, [("spec.shards", "'8' is not of type 'integer'")]),
    ("queue expiry zero", manifest(queueExpirySeconds=0), None,
     [("spec.queueExpirySeconds", "0 is less than the minimum of 1")]),
    ("queue expiry over a year", manifest(queueExpirySeconds=31536001), None,
     [("spec.queueExpirySeconds", "31536001 is greater than the maximum of 31536000")]),
    ("message expiry over a year", manifest(messageExpirySeconds=31536001), None,
     [("spec.messageExpirySeconds", "31536001 is greater than the maximum of 31536000")]),
    ("negative concurrency", manifest(concurrency=-1), None,
     [("spec.concurrency", "-1 is less than the minimum of 0")]),
    ("concurrency over 100", manifest(concurrency=101), None,
     [("spec.concurrency", "101 is greater than the maximum of 100")]),
    ("shovel concurrency zero", manifest(shovel={"concurrency": 0}), None,
     [("spec.shovel.concurrency", "0 is less than the minimum of 1")]),
    ("shovel concurrency over 50", manifest(shovel={"concurrency": 51}), None,
     [("spec.shovel.concurrency", "51 is greater than the maximum of 50")]),
    ("shovel interval over a day", manifest(shovel={"intervalSeconds": 86401}), None,
     [("spec.shovel.intervalSeconds", "86401 is greater than the maximum of 86400")]),
    ("shovel enabled as a string", manifest(shovel={"enabled": "yes"}), None,
     [("spec.shovel.enabled", "'yes' is not of type 'boolean'")]),
    ("sweep duration under 5 minutes", manifest(sweepDurationSeconds=299), None,
     [("spec.sweepDurationSeconds", "299 is less than the minimum of 300")]),
    ("sweep duration over 5 hours", manifest(sweepDurationSeconds=18001), None,
     [("spec.sweepDurationSeconds", "18001 is greater than the maximum of 18000")]),
    ("batch of one", manifest(batching={"maxBatchSize": 1, "maxWaitSeconds": 1}), None,
     [("spec.batching.maxBatchSize", "1 is less than the minimum of 2")]),
    ("batch too big", manifest(batching={"maxBatchSize": 200001, "maxWaitSeconds": 1}), None,
     [("spec.batching.maxBatchSize", "200001 is greater than the maximum of 200000")]),
    ("batch wait zero", manifest(batching={"maxBatchSize": 10, "maxWaitSeconds": 0}), None,
     [("spec.batching.maxWaitSeconds", "0 is less than the minimum of 1")]),
    ("batch wait over 5 minutes", manifest(batching={"maxBatchSize": 10, "maxWaitSeconds": 301}), None,
     [("spec.batching.maxWaitSeconds", "301 is greater than the maximum of 300")]),
    ("batching without wait", manifest(batching={"maxBatchSize": 10}), None, [("spec.batching", BATCHING)]),
    ("batching without size", manifest(batching={"maxWaitSeconds": 5}), None, [("spec.batching", BATCHING)]),
    ("batching empty", manifest(batching={}), None, []),  # replaced below: {} is "neither", allowed
    ("negative maxDeliveries", manifest(maxDeliveries=-1), None,
     [("spec.maxDeliveries", "-1 is less than the minimum of 0")]),
    ("maxDeliveries over 1000", manifest(maxDeliveries=1001), None,
     [("spec.maxDeliveries", "1001 is greater than the maximum of 1000")]),
    ("handler timeout zero", manifest(handlerTimeoutSeconds=0), None,
     [("spec.handlerTimeoutSeconds", "0 is less than the minimum of 1")]),
    ("handler timeout over 30 minutes", manifest(handlerTimeoutSeconds=1801), None,
     [("spec.handlerTimeoutSeconds", "1801 is greater than the maximum of 1800")]),
    ("unknown deletionPolicy", manifest(deletionPolicy="Purge"), None,
     [("spec.deletionPolicy", "'Purge' is not one of ['Retain', 'Delete']")]),
    ("queue expires before its messages", manifest(queueExpirySeconds=60, messageExpirySeconds=120), None,
     [("spec", QUEUE_EXPIRY)]),
    ("queue expiry under the default message expiry", manifest(queueExpirySeconds=3600), None,
     [("spec", QUEUE_EXPIRY)]),
    ("retry backoff min over max", manifest(retry={"minBackoffSeconds": 60, "maxBackoffSeconds": 10}), None,
     [("spec.retry", "retry.minBackoffSeconds must be <= retry.maxBackoffSeconds")]),
    ("retry backoff longer than the messages live",
     manifest(messageExpirySeconds=60, queueExpirySeconds=60, retry={"maxBackoffSeconds": 120}), None,
     [("spec", "retry.maxBackoffSeconds must be <= messageExpirySeconds: a retry may not wait longer than its "
               "message lives")]),
    ("retry multiplier under 1", manifest(retry={"multiplier": 0.5}), None,
     [("spec.retry.multiplier", "0.5 is less than the minimum of 1")]),
    ("name over 63 characters", manifest(name="q" * 64), None,
     [("", "metadata.name is the queue name and may be at most 63 characters")]),
    ("shards shrink", manifest(shards=8), manifest(shards=16), [("spec.shards", SHRINK)]),
    ("shards shrink to the default", manifest(), manifest(shards=64), [("spec.shards", SHRINK)]),
    ("clientId changed", manifest(clientId="b"), manifest(clientId="a"), [("spec", CLIENT_ID)]),
    ("clientId removed", manifest(), manifest(clientId="a"), [("spec", CLIENT_ID)]),
    ("clientId added", manifest(clientId="a"), manifest(), [("spec", CLIENT_ID)]),
    ("shrink and clientId change at once", manifest(shards=4, clientId="b"), manifest(shards=8, clientId="a"),
     [("spec", CLIENT_ID), ("spec.shards", SHRINK)]),
]
INVALID = [c for c in INVALID if c[0] != "batching empty"]


# QueueSpec (pydantic, lax mode) coerces "8", "yes" and True (a start of 1 ms); the API server is strict. A missing
# spec is a different message there. Every other create-time refusal is shared.
LAX = {"no spec", "shards as a string", "shovel enabled as a string", "maxLength as a string", "a start as a boolean"}


def test_invalid_table_is_big_enough() -> None:
    assert len(INVALID) >= 25


@pytest.mark.parametrize(("case", "doc", "old", "expected"), INVALID, ids=[c[0] for c in INVALID])
def test_invalid_table(case: str, doc: dict[str, Any], old: dict[str, Any] | None,
                       expected: list[tuple[str, str]]) -> None:
    assert admit(doc, old) == sorted(expected)
    if old is None and case not in LAX:
        # what the API server refuses, QueueSpec refuses too (transition rules need the stored object)
        with pytest.raises(InvalidSpecError):
            QueueSpec.from_manifest(doc)


# ---- subscribe: admission refuses what the operator would refuse (ignis/subjects.py, ignis.spec.start_ms) ----
def _subscription(**subscribe: Any) -> dict[str, Any]:
    return manifest(subscribe={"topic": "events", **subscribe})


def test_every_filter_admission_accepts_the_operator_accepts_and_back() -> None:
    """Every filter of up to three pieces from an alphabet of levels, wildcards in and out of place, separators
    and NUL: the CEL rules and ignis.subjects.filter_problem agree on each."""
    import itertools

    from ignis.subjects import filter_problem

    pieces = ["a", "+", "#", "/", "a+", "#a", "\0", " ", "b.c"]
    checked, disagree = 0, []
    for n in (1, 2, 3):
        for parts in itertools.product(pieces, repeat=n):
            text = "".join(parts)
            checked += 1
            if (admit(_subscription(filter=text)) == []) != (filter_problem(text) is None):
                disagree.append(text)
    assert checked > 800 and disagree == []


START_SAMPLES = [f"{y}-{m}-{d}T12:00:00Z" for y in ("0001", "1900", "2000", "2024", "2026", "2100", "2400")
                 for m in ("00", "01", "02", "04", "12", "13") for d in ("00", "01", "28", "29", "30", "31", "32")] + [
    f"2026-11-28{t}" for t in ("T00:00", "T23:59:59", "T24:00:00", "T12:60:00", "T12:00:60", "T12:00:00.1234567",
                               "T12:00:00+23:59", "T12:00:00+24:00", "T12:00:00-05:30", "T12:00:00.5", "T12:00:00.Z",
                               "T12:00:00+0100", "t12:00:00Z", "T12:00:00z", "T12:00:00+05:75", "T12:00:60Z",
                               "T12:00:00.000000001Z", "T12:00Z")] + [
    "earliest", "latest", "Latest", "0", "17", "-1", "1e3", "", "soon", "2026-11-28", 0, 1795870000000, -5]


@pytest.mark.parametrize("start", START_SAMPLES, ids=repr)
def test_a_start_admission_accepts_is_one_the_operator_accepts(start: Any) -> None:
    """Admission may be stricter than the Python parser (it wants RFC 3339: 2026-11-28 alone is refused), never
    looser: a start it lets through is never an InvalidSpec on the operator's side."""
    from ignis.spec import start_ms

    if admit(_subscription(start=start)) == []:
        start_ms(start)  # raises for a start the operator would refuse


def test_subscription_status_fields_are_in_the_schema() -> None:
    """A subscription's status shows its topic, lag and the messages it lost to retention."""
    from ignis_operator.reconcile import subscription_status

    status_schema = schema()["properties"]["status"]
    status = subscription_status("events", {"lag": 4, "expired": 1})
    assert set(status) == {"topic", "lag", "expired"} <= set(status_schema["properties"])
    Draft7Validator(status_schema).validate(status)


def test_transition_rules_do_not_run_on_create() -> None:
    assert cel_errors(apply_defaults(schema(), manifest(shards=1))) == []


def test_empty_batching_is_neither_and_allowed() -> None:
    assert admit(manifest(batching={})) == []

"""QueueSpec: every field's limits and defaults, errors that name field, value and rule, manifests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ignis.errors import InvalidSpecError
from ignis.manifest import load_manifests
from ignis.spec import QueueSpec

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "queues"


def build(**fields: Any) -> QueueSpec:
    fields.setdefault("name", "orders")
    fields.setdefault("handlerType", "orders.v1")
    return QueueSpec.build(**fields)


def test_defaults() -> None:
    spec = build()
    assert spec.shards == 32 and spec.concurrency == 1 and spec.batching is None
    assert spec.shovel.enabled and spec.shovel.concurrency == 4 and spec.shovel.interval_seconds == 600
    assert spec.sweep_duration_seconds == 1200 and spec.max_deliveries == 10
    assert spec.deletion_policy.value == "Retain"
    assert spec.record_ttl_seconds == spec.queue_expiry_seconds * 2


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"shards": 0}, "shards=0: Input should be greater than or equal to 1"),
        ({"shards": 513}, "shards=513: Input should be less than or equal to 512"),
        ({"concurrency": -1}, "concurrency=-1: Input should be greater than or equal to 0"),
        ({"concurrency": 101}, "concurrency=101: Input should be less than or equal to 100"),
        ({"queueExpirySeconds": 31536001},
         "queueExpirySeconds=31536001: Input should be less than or equal to 31536000"),
        ({"messageExpirySeconds": 0}, "messageExpirySeconds=0: Input should be greater than or equal to 1"),
        ({"queueExpirySeconds": 100, "messageExpirySeconds": 200},
         "queueExpirySeconds (100) must be >= messageExpirySeconds (200)"),
        ({"shovel": {"concurrency": 0}}, "shovel.concurrency=0: Input should be greater than or equal to 1"),
        ({"shovel": {"concurrency": 51}}, "shovel.concurrency=51: Input should be less than or equal to 50"),
        ({"shovel": {"intervalSeconds": -1}}, "shovel.intervalSeconds=-1: Input should be greater than or equal to 0"),
        ({"shovel": {"intervalSeconds": 86401}}, "shovel.intervalSeconds=86401: Input should be less than or equal"),
        ({"sweepDurationSeconds": 299}, "sweepDurationSeconds=299: Input should be greater than or equal to 300"),
        ({"sweepDurationSeconds": 18001}, "sweepDurationSeconds=18001: Input should be less than or equal to 18000"),
        ({"batching": {"maxBatchSize": 1, "maxWaitSeconds": 1}},
         "batching.maxBatchSize=1: Input should be greater than or equal to 2"),
        ({"batching": {"maxBatchSize": 200001, "maxWaitSeconds": 1}},
         "batching.maxBatchSize=200001: Input should be less than or equal to 200000"),
        ({"batching": {"maxBatchSize": 2, "maxWaitSeconds": 0}},
         "batching.maxWaitSeconds=0: Input should be greater than or equal to 1"),
        ({"batching": {"maxBatchSize": 2, "maxWaitSeconds": 301}},
         "batching.maxWaitSeconds=301: Input should be less than or equal to 300"),
        ({"batching": {"maxBatchSize": 10}}, "batching.maxWaitSeconds: required field is missing"),
        ({"maxDeliveries": -1}, "maxDeliveries=-1: Input should be greater than or equal to 0"),
        ({"handlerTimeoutSeconds": 0}, "handlerTimeoutSeconds=0: Input should be greater than or equal to 1"),
        ({"deletionPolicy": "Purge"}, "deletionPolicy='Purge': Input should be 'Retain' or 'Delete'"),
        ({"name": "Orders_Q"}, "name='Orders_Q': must be a lowercase DNS name"),
        ({"name": "a" * 64}, "name='" + "a" * 64 + "': String should have at most 63 characters"),
        ({"clientId": "Bad Client"}, "clientId='Bad Client': must be a lowercase DNS label"),
        ({"handlerType": ""}, "handlerType='': String should have at least 1 character"),
        ({"shards": "many"}, "shards='many': Input should be a valid integer"),
        ({"surprise": 1}, "surprise: unknown field"),
    ],
)
def test_every_violation_names_field_value_and_rule(fields: dict[str, Any], expected: str) -> None:
    with pytest.raises(InvalidSpecError) as caught:
        build(**fields)
    assert expected in str(caught.value)


def test_all_problems_are_reported_at_once() -> None:
    with pytest.raises(InvalidSpecError) as caught:
        build(shards=0, concurrency=500, batching={"maxBatchSize": 1})
    assert len(caught.value.problems) == 4


@pytest.mark.parametrize(
    "fields",
    [{"shards": 1}, {"shards": 512}, {"concurrency": 0}, {"concurrency": 100},
     {"queueExpirySeconds": 31536000, "messageExpirySeconds": 31536000},
     {"shovel": {"concurrency": 50, "intervalSeconds": 0}}, {"shovel": {"enabled": False}},
     {"sweepDurationSeconds": 300}, {"sweepDurationSeconds": 18000},
     {"batching": {"maxBatchSize": 2, "maxWaitSeconds": 1}},
     {"batching": {"maxBatchSize": 200000, "maxWaitSeconds": 300}}, {"maxDeliveries": 0}],
)
def test_limits_are_inclusive(fields: dict[str, Any]) -> None:
    build(**fields)


@pytest.mark.parametrize(
    "fields",
    [{}, {"shards": 7, "concurrency": 0, "shovel": {"enabled": False}},
     {"batching": {"maxBatchSize": 500, "maxWaitSeconds": 2}, "maxDeliveries": 0, "deletionPolicy": "Delete"},
     {"handlerTimeoutSeconds": 30, "sweepDurationSeconds": 900, "shovel": {"concurrency": 9, "intervalSeconds": 0}}],
)
def test_record_bins_round_trip(fields: dict[str, Any]) -> None:
    spec = build(**fields)
    bins = spec.config_bins()
    assert all(len(name) <= 15 for name in bins)  # Aerospike bin-name limit
    assert QueueSpec.from_bins("orders", bins) == spec


def test_bins_use_design_units() -> None:
    bins = build(sweepDurationSeconds=600, batching={"maxBatchSize": 5, "maxWaitSeconds": 3}).config_bins()
    assert bins["sweepDuration"] == 600_000  # milliseconds
    assert (bins["maxBatchSize"], bins["maxWaitTime"]) == (5, 3)
    assert build().config_bins()["maxBatchSize"] == 0  # 0 = batching off


def test_manifest_round_trip_and_namespace_default() -> None:
    spec = build(shards=3, batching={"maxBatchSize": 2, "maxWaitSeconds": 1})
    assert QueueSpec.from_manifest(spec.to_manifest()) == spec
    doc = spec.to_manifest()
    doc["metadata"]["namespace"] = "payments"
    assert QueueSpec.from_manifest(doc).client_id == "payments"
    doc["spec"]["clientId"] = "billing"
    assert QueueSpec.from_manifest(doc).client_id == "billing"


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        ({"apiVersion": "v1", "kind": "IgnisQueue", "metadata": {"name": "a"}, "spec": {"handlerType": "h"}},
         "apiVersion='v1': must be 'ignismq.io/v1alpha1'"),
        ({"apiVersion": "ignismq.io/v1alpha1", "kind": "IgnisQueue", "metadata": {}, "spec": {"handlerType": "h"}},
         "metadata.name: required"),
        ({"apiVersion": "ignismq.io/v1alpha1", "kind": "IgnisQueue", "metadata": {"name": "a"}},
         "spec: required mapping"),
        ({"apiVersion": "ignismq.io/v1alpha1", "kind": "IgnisQueue", "metadata": {"name": "a"}, "spec": {}},
         "handlerType: required field is missing"),
        ("just a string", "manifest must be a mapping"),
    ],
)
def test_bad_manifests(doc: Any, expected: str) -> None:
    with pytest.raises(InvalidSpecError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        QueueSpec.from_manifest(doc, "test.yaml")


def test_examples_are_valid() -> None:
    specs = load_manifests(EXAMPLES)
    assert sorted(s.name for s in specs) == ["audit", "events", "orders"]


def test_one_bad_document_rejects_the_whole_apply(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text((EXAMPLES / "orders.yaml").read_text())
    (tmp_path / "b.yaml").write_text(
        "apiVersion: ignismq.io/v1alpha1\nkind: IgnisQueue\nmetadata: {name: bad}\nspec: {handlerType: h, shards: 0}\n"
        "---\nkind: Namespace\napiVersion: v1\nmetadata: {name: skipped}\n"
    )
    (tmp_path / "c.yml").write_text("key: [unclosed\n")
    with pytest.raises(InvalidSpecError) as caught:
        load_manifests(tmp_path)
    problems = caught.value.problems
    assert len(problems) == 2
    assert "b.yaml (document 1)" in problems[0] and "shards=0" in problems[0]
    assert "c.yml: not valid YAML" in problems[1]


def test_duplicate_queue_across_files(tmp_path: Path) -> None:
    for name in ("a.yaml", "b.yaml"):
        (tmp_path / name).write_text((EXAMPLES / "orders.yaml").read_text())
    with pytest.raises(InvalidSpecError, match="also declared in"):
        load_manifests(tmp_path)

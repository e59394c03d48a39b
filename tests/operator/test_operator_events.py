"""What an SRE sees from the operator: Normal Events (Created, Updated, Deactivated, Deleted) beside the
Warnings, so `kubectl describe iq` tells the story; one INFO line per reconcile; drift repairs counted."""

from __future__ import annotations

import logging

import pytest
from kopf_harness import Harness
from prometheus_client import REGISTRY
from test_operator_scale import passes

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(120)]


def normal(harness: Harness, reason: str, name: str) -> list[dict]:
    return [e for e in harness.events(reason) if e["type"] == "Normal" and e["involvedObject"]["name"] == name]


def drift_repairs() -> float:
    return REGISTRY.get_sample_value("ignis_operator_drift_repairs_total") or 0.0


async def test_normal_events_tell_a_queues_story(harness: Harness, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    await harness.create("orders", shards=2)
    created = await harness.until(lambda: normal(harness, "Created", "orders"), what="a Created event")
    assert created[0]["message"] == "queue record created (2 shards)"
    assert any(r.getMessage() == "queue record created (2 shards)" and r.levelno == logging.INFO
               for r in caplog.records)

    await harness.edit("orders", shards=4)
    updated = await harness.until(lambda: normal(harness, "Updated", "orders"), what="an Updated event")
    assert "shards 2 -> 4" in updated[0]["message"]

    await harness.delete("orders")
    gone = await harness.until(lambda: normal(harness, "Deactivated", "orders"), what="a Deactivated event")
    assert "data kept (deletionPolicy Retain)" in gone[0]["message"]

    await harness.create("audit", shards=1, deletionPolicy="Delete")
    await harness.until(lambda: normal(harness, "Created", "audit"), what="audit created")
    await harness.delete("audit")
    deleted = await harness.until(lambda: normal(harness, "Deleted", "audit"), what="a Deleted event")
    assert "deleted with 0 messages" in deleted[0]["message"]
    assert not [e for e in harness.events() if e["type"] == "Warning"]  # a clean life: no warning at all


async def test_drift_repairs_are_counted(harness: Harness) -> None:
    await harness.create("orders", shards=2)
    await harness.until(lambda: normal(harness, "Created", "orders"), what="created")
    # Creation handlers are at-least-once (kopf may run one again for a repeated watch event): delete the
    # record only once a drift pass has run since, so the repair below is the pass's, not a late create.
    await passes(harness, drift=1, figures=0)
    before = drift_repairs()
    harness.store.with_client("ns1").delete_queue("orders")
    await harness.until(lambda: harness.events("DriftRepaired"), what="a DriftRepaired warning")
    await harness.until(lambda: drift_repairs() > before, what="the drift repair counted")

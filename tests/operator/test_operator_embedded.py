"""Embedded mode: ManifestSync over a directory of manifest files, and `ignis operator --manifests`."""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from admission import ROOT
from ignis_operator.embedded import ManifestSync
from ignis_operator.reconcile import CONFLICT, INVALID_SPEC, OWNER_BIN, REMOVED
from prometheus_client import REGISTRY
from support.polling import wait_for

from ignis.cli.app import run
from ignis.errors import InvalidInputError
from ignis.queue import Queue
from ignis.spec import QueueSpec
from ignis.storage import Storage, open_store

EXAMPLES = ROOT / "examples" / "queues"


@pytest.fixture
def lmdb(tmp_path: Path) -> Iterator[Storage]:
    store = open_store(f"lmdb://{tmp_path}/store?durability=fast")
    yield store
    store.close()


@pytest.fixture
def manifests(tmp_path: Path) -> Path:
    directory = tmp_path / "manifests"
    shutil.copytree(EXAMPLES, directory)
    return directory


def write(directory: Path, name: str, queue: str, **spec: object) -> Path:
    lines = [f"{k}: {json.dumps(v)}" for k, v in {"handlerType": queue, **spec}.items()]
    body = "\n".join("  " + line for line in lines)
    path = directory / name
    path.write_text(f"apiVersion: ignismq.io/v1alpha1\nkind: IgnisQueue\nmetadata:\n  name: {queue}\nspec:\n{body}\n")
    return path


def active(store: Storage, client_id: str = "default") -> list[str]:
    return [r.name for r in store.with_client(client_id).list_queues(active=True)]


def test_examples_sync_into_the_store(lmdb: Storage, manifests: Path) -> None:
    results = ManifestSync(lmdb, manifests).sync_once()
    assert [(r.name, r.ready, r.created) for r in results] == [
        ("audit", True, True), ("events", True, True), ("orders", True, True)]
    assert active(lmdb) == ["audit", "events", "orders"]
    orders = lmdb.get_queue("orders")
    assert orders is not None and orders.bins["maxDeliveries"] == 5
    assert QueueSpec.from_bins("orders", orders.bins) == QueueSpec.from_manifest(
        __import__("yaml").safe_load((EXAMPLES / "orders.yaml").read_text()))
    again = ManifestSync(lmdb, manifests).sync_once()  # a restarted sync changes nothing
    assert all(r.ready and not r.created and not r.diff for r in again)


def test_invalid_manifest_is_reported_and_the_others_still_sync(lmdb: Storage, manifests: Path) -> None:
    write(manifests, "bad.yaml", "broken", shards=0)
    (manifests / "garbage.yaml").write_text("apiVersion: [unclosed\n")
    results = ManifestSync(lmdb, manifests).sync_once()
    failed = {r.name: r for r in results if not r.ready}
    assert set(failed) == {"broken", "garbage"}
    assert failed["broken"].reason == INVALID_SPEC and "shards=0" in failed["broken"].message
    assert failed["garbage"].reason == INVALID_SPEC and "not valid YAML" in failed["garbage"].message
    assert active(lmdb) == ["audit", "events", "orders"]  # nothing of the bad ones written


def test_removed_manifest_applies_its_deletion_policy(lmdb: Storage, manifests: Path) -> None:
    sync = ManifestSync(lmdb, manifests)
    sync.sync_once()
    Queue(lmdb, QueueSpec.from_bins("orders", lmdb.get_queue("orders").bins)).publish(b"keep me")  # type: ignore[union-attr]
    (manifests / "orders.yaml").unlink()  # Retain
    (manifests / "events.yaml").unlink()  # Delete
    results = [r for r in sync.sync_once() if r.action == REMOVED]
    assert sorted((r.name, r.ready) for r in results) == [("events", True), ("orders", True)]
    assert active(lmdb) == ["audit"]
    orders = lmdb.get_queue("orders")
    assert orders is not None and not orders.active  # Retain: deactivated, data kept
    assert Queue(lmdb, QueueSpec.from_bins("orders", orders.bins)).stats().depth == 1
    assert lmdb.get_queue("events") is None  # Delete: gone


def test_removal_waits_while_any_manifest_is_invalid(lmdb: Storage, manifests: Path) -> None:
    sync = ManifestSync(lmdb, manifests)
    sync.sync_once()
    (manifests / "events.yaml").write_text("apiVersion: [typo\n")  # a half-saved edit, not a deletion
    results = sync.sync_once()
    assert not [r for r in results if r.action == REMOVED]
    assert lmdb.get_queue("events") is not None


def test_moving_a_queue_between_files_is_not_a_deletion(lmdb: Storage, manifests: Path) -> None:
    sync = ManifestSync(lmdb, manifests)
    sync.sync_once()
    (manifests / "events.yaml").rename(manifests / "sub-events.yaml")
    results = sync.sync_once()
    assert not [r for r in results if r.action == REMOVED]
    assert "events" in active(lmdb)


def test_same_queue_twice_in_the_directory_first_file_wins(lmdb: Storage, manifests: Path) -> None:
    write(manifests, "zz-orders-again.yaml", "orders", concurrency=9)
    results = ManifestSync(lmdb, manifests).sync_once()
    loser = next(r for r in results if r.source and r.source.endswith("zz-orders-again.yaml"))
    assert (loser.ready, loser.reason) == (False, CONFLICT)
    assert lmdb.get_queue("orders").bins["concurrency"] == 4  # type: ignore[union-attr]


def test_namespace_or_client_id_selects_the_client(lmdb: Storage, tmp_path: Path) -> None:
    directory = tmp_path / "m"
    directory.mkdir()
    write(directory, "a.yaml", "alpha", clientId="billing")
    ManifestSync(lmdb, directory, default_client_id="apps").sync_once()
    write(directory, "b.yaml", "beta")
    ManifestSync(lmdb, directory, default_client_id="apps").sync_once()
    assert active(lmdb, "billing") == ["alpha"] and active(lmdb, "apps") == ["beta"]
    assert {"billing", "apps"} <= set(lmdb.list_clients())


def test_two_directories_claiming_one_queue_older_wins(lmdb: Storage, tmp_path: Path) -> None:
    first, second = tmp_path / "one", tmp_path / "two"
    first.mkdir()
    second.mkdir()
    write(first, "q.yaml", "shared", concurrency=1)
    write(second, "q.yaml", "shared", concurrency=2)
    ManifestSync(lmdb, first).sync_once()
    (result,) = ManifestSync(lmdb, second).sync_once()
    assert result.reason == CONFLICT
    assert lmdb.get_queue("shared").bins[OWNER_BIN]["uid"].endswith("one")  # type: ignore[union-attr]


def test_missing_directory_is_a_clear_error(lmdb: Storage, tmp_path: Path) -> None:
    with pytest.raises(InvalidInputError, match="does not exist"):
        ManifestSync(lmdb, tmp_path / "nope")



def test_run_picks_up_changes_and_repairs_drift(lmdb: Storage, manifests: Path) -> None:
    sync = ManifestSync(lmdb, manifests, resync_seconds=0.2)
    stop = threading.Event()
    thread = threading.Thread(target=sync.run, args=(stop,), kwargs={"interval": 0.05}, daemon=True)
    thread.start()
    try:
        wait_for(lambda: active(lmdb) == ["audit", "events", "orders"])
        write(manifests, "new.yaml", "fresh")
        wait_for(lambda: "fresh" in active(lmdb))
        repairs = REGISTRY.get_sample_value("ignis_operator_drift_repairs_total") or 0
        lmdb.delete_queue("audit")  # drift: restored by the periodic resync without any file change
        wait_for(lambda: "audit" in active(lmdb))
        wait_for(lambda: (REGISTRY.get_sample_value("ignis_operator_drift_repairs_total") or 0) > repairs)
    finally:
        stop.set()
        thread.join(timeout=10)
    assert not thread.is_alive()


def test_cli_once_json(tmp_path: Path, manifests: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = f"lmdb://{tmp_path}/cli?durability=fast"
    assert run(["--store", store, "operator", "--manifests", str(manifests), "--once", "-o", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [(d["name"], d["ready"], d["reason"]) for d in doc] == [
        ("audit", True, "Synced"), ("events", True, "Synced"), ("orders", True, "Synced")]
    write(manifests, "bad.yaml", "bad", concurrency=1000)
    assert run(["--store", store, "operator", "--manifests", str(manifests), "--once"]) == 2
    out = capsys.readouterr().out
    assert "FAIL default/bad [InvalidSpec] concurrency=1000" in out


def test_cli_once_needs_manifests(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["operator", "--once"]) == 2
    assert "--once needs --manifests DIR" in capsys.readouterr().err

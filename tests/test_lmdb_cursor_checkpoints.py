"""A subscription's cursor environment under `durability=fsync` commits without a flush and is made durable by
checkpoints (ignis.storage.lmdb.checkpoints): what a process restart keeps (everything), what a machine restart
undoes (what came after the last checkpoint, delivered again, never lost), and that a torn environment is not read.

A machine crash is played by copying the store's directory while it is open (what the disk would hold if the page
cache had reached it; the copy's cursor file is torn on purpose where the test says so) and opening the copy with
another boot id."""

from __future__ import annotations

import contextlib
import logging
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.polling import wait_for

from ignis import Ignis, QueueSpec, TopicSpec, names
from ignis.errors import InvalidInputError
from ignis.storage import open_store
from ignis.storage.lmdb import checkpoints
from ignis.storage.lmdb.cursor_environments import CURSORS_DIR
from ignis.storage.lmdb.store import LmdbStore

SUB, TOPIC = "audit", "orders"
CURSOR = names.cursor_of(SUB, TOPIC)


@pytest.fixture
def ignis(tmp_path: Path) -> Iterator[Ignis]:
    with Ignis(f"lmdb://{tmp_path}/store") as client:  # durability=fsync, cursor_durability=checkpoint: the defaults
        client.apply(TopicSpec.build(name=TOPIC, shards=1))
        client.apply(QueueSpec.build(name=SUB, handlerType=SUB, shards=1, subscribe={"topic": TOPIC,
                                                                                     "start": "earliest"}))
        yield client


def _publish(ignis: Ignis, count: int) -> list[str]:
    return [ignis.topic(TOPIC).publish(f"m{i}".encode(), subject="orders/eu").id for i in range(count)]


def _consume(ignis: Ignis, count: int) -> list[str]:
    """Fire and ack `count` messages of the subscription; their ids."""
    ids = []
    for _ in range(count):
        message = ignis.queue(SUB).fire()
        assert message is not None
        message.ack()
        ids.append(message.id)
    return ids


def _drain(ignis: Ignis) -> list[str]:
    ids = []
    while (message := ignis.queue(SUB).fire()) is not None:
        message.ack()
        ids.append(message.id)
    return ids


def _cursor_dir(root: Path) -> Path:
    return root / "store" / CURSORS_DIR / CURSOR


def _store(ignis: Ignis) -> LmdbStore:
    store = ignis.queue(SUB).store
    assert isinstance(store, LmdbStore)
    return store


def _position(ignis: Ignis) -> int:
    store = _store(ignis)
    record = store.raw_record(names.meta_set(store.client_id), names.meta_key(CURSOR, 0))
    return int(record[1]["FIRE_POINTER"]) if record else 0


def _copy_as_the_disk_holds_it(src: Path, dst: Path) -> None:
    """The store's files as they are now (LMDB's lock files aside: a new boot starts them afresh)."""
    shutil.copytree(src / "store", dst / "store", ignore=shutil.ignore_patterns("lock.mdb", "*.tmp"))


@contextlib.contextmanager
def _after_a_machine_crash(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, torn: bool = False) -> Iterator[Ignis]:
    """The store as the disk holds it now (`torn`: the cursor's data file overwritten), opened on another boot."""
    copy = tmp_path / "copy"
    _copy_as_the_disk_holds_it(tmp_path, copy)
    if torn:
        data = _cursor_dir(copy) / checkpoints.DATA_FILE
        data.write_bytes(b"\xde\xad" * (data.stat().st_size // 2))  # the restore must not read it
    monkeypatch.setattr(checkpoints, "boot_id", lambda: "another-boot")
    with Ignis(f"lmdb://{copy}/store") as again:
        yield again
    assert (_cursor_dir(copy) / checkpoints.BOOT_FILE).read_text() == "another-boot"


def test_a_cursor_commits_without_a_flush_and_has_a_checkpoint_from_its_start(ignis: Ignis, tmp_path: Path) -> None:
    own = _store(ignis)._cursors.of(CURSOR)
    assert own.env.durability == "checkpoint"
    assert own.env.env.flags()["sync"] is False  # LMDB's MDB_NOSYNC: a claim's commit waits for no disk
    assert own.env.env.flags()["map_async"] is False
    assert (_cursor_dir(tmp_path) / checkpoints.CHECKPOINT_FILE).exists()  # the subscription's start is one
    assert (_cursor_dir(tmp_path) / checkpoints.BOOT_FILE).read_text() == checkpoints.boot_id()
    # The store's own environment still flushes every commit.
    assert _store(ignis)._ctx.env.env.flags()["sync"] is True


def test_a_process_restart_keeps_every_ack_even_those_after_the_last_checkpoint(ignis: Ignis, tmp_path: Path) -> None:
    _publish(ignis, 6)
    done = _consume(ignis, 4)
    copy = tmp_path / "copy"
    _copy_as_the_disk_holds_it(tmp_path, copy)  # the same boot: the process died, the machine did not
    with Ignis(f"lmdb://{copy}/store") as again:
        assert _position(again) == 4
        rest = _drain(again)
    assert len(rest) == 2 and not set(rest) & set(done)


def test_a_machine_restart_restores_the_checkpoint_and_delivers_again_what_came_after_it(
        ignis: Ignis, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    ids = _publish(ignis, 10)
    own = _store(ignis)._cursors.of(CURSOR)
    before = _consume(ignis, 4)
    own.flush()  # a checkpoint at position 4 (a durable write in the cursor's environment takes one)
    checkpoints.CHECKPOINTER.unregister(own.env.checkpoints)  # and no later one before the "crash"
    after = _consume(ignis, 3)
    assert _position(ignis) == 7
    with caplog.at_level(logging.WARNING, logger="ignis.storage.lmdb.checkpoints"), \
            _after_a_machine_crash(tmp_path, monkeypatch, torn=True) as again:
        assert _position(again) == 4
        redelivered = _drain(again)
    said = [r.getMessage() for r in caplog.records if r.name == "ignis.storage.lmdb.checkpoints"]
    assert len(said) == 1 and CURSOR in said[0] and "restored its checkpoint" in said[0], said  # said once, by name
    # The 3 acked after the checkpoint come again, with the 3 never consumed; the 4 before it do not: nothing lost.
    assert redelivered == after + ids[7:]
    assert set(before) | set(redelivered) == set(ids)


def test_the_checkpoint_follows_the_commits_within_about_a_second(
        ignis: Ignis, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _publish(ignis, 5)
    _consume(ignis, 5)
    checkpoint = _cursor_dir(tmp_path) / checkpoints.CHECKPOINT_FILE
    written = checkpoint.stat().st_mtime_ns
    wait_for(lambda: checkpoint.stat().st_mtime_ns != written, timeout=10, what="a checkpoint after the acks")
    with _after_a_machine_crash(tmp_path, monkeypatch) as again:
        assert _position(again) == 5
        assert _drain(again) == []


def test_a_seek_is_checkpointed_before_it_returns(ignis: Ignis, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                  ) -> None:
    _publish(ignis, 6)
    own = _store(ignis)._cursors.of(CURSOR)
    checkpoints.CHECKPOINTER.unregister(own.env.checkpoints)  # only the seek's own checkpoint counts here
    ignis.seek(SUB, "2000-01-01T00:00:00Z")  # back to the start...
    _consume(ignis, 6)
    ignis.seek(SUB, 4102444800000)  # ... and past the end (2100): nothing left
    with _after_a_machine_crash(tmp_path, monkeypatch) as again:
        assert _position(again) == 6
        assert _drain(again) == []


def test_a_clean_close_checkpoints_what_came_after_the_last(
        ignis: Ignis, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _publish(ignis, 3)
    own = _store(ignis)._cursors.of(CURSOR)
    checkpoints.CHECKPOINTER.unregister(own.env.checkpoints)
    _consume(ignis, 3)
    ignis.close()
    monkeypatch.setattr(checkpoints, "boot_id", lambda: "another-boot")  # a clean reboot undoes nothing
    with Ignis(f"lmdb://{tmp_path}/store") as again:
        assert _position(again) == 3
        assert _drain(again) == []


def test_cursor_durability_fsync_flushes_every_commit_and_writes_no_checkpoint(tmp_path: Path) -> None:
    with Ignis(f"lmdb://{tmp_path}/store?cursor_durability=fsync") as client:
        client.apply(TopicSpec.build(name=TOPIC, shards=1))
        client.apply(QueueSpec.build(name=SUB, handlerType=SUB, shards=1, subscribe={"topic": TOPIC}))
        store = _store(client)
        assert store.url.endswith("?durability=fsync&cursor_durability=fsync")
        own = store._cursors.of(CURSOR)
        assert own.env.env.flags()["sync"] is True and own.env.checkpoints is None
        client.topic(TOPIC).publish(b"x", subject="orders/eu")
        _consume(client, 1)
    assert not (_cursor_dir(tmp_path) / checkpoints.CHECKPOINT_FILE).exists()


def test_without_a_boot_id_a_cursor_flushes_as_the_store_does(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                                ) -> None:
    monkeypatch.setattr(checkpoints, "boot_id", lambda: None)  # (no way to tell a machine restart)
    with Ignis(f"lmdb://{tmp_path}/store") as client:
        client.apply(TopicSpec.build(name=TOPIC, shards=1))
        client.apply(QueueSpec.build(name=SUB, handlerType=SUB, shards=1, subscribe={"topic": TOPIC}))
        own = _store(client)._cursors.of(CURSOR)
        assert own.env.env.flags()["sync"] is True and own.env.checkpoints is None


def test_a_bad_cursor_durability_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(InvalidInputError, match="cursor_durability='sometimes'"):
        open_store(f"lmdb://{tmp_path}/store?cursor_durability=sometimes")
    assert not (tmp_path / "store").exists()

"""The sweep (DESIGN §4): re-home messages that a consumer claimed and never settled.

    sweeper = Sweeper(store, epoch_source=lambda: epoch, clock=now_ms, threads=64)
    reports = sweeper.sweep_all()                  # every active queue of every client of the farm
    report = sweeper.sweep_queue("default", "orders")

Per queue magazine and shard, from the stored sweep pointer (the NEXT slot to examine; absent = 1) up
to the fire pointer, in batches of `batch_size` slots:

* absent record → already acked: pass; unless its slot may still be written (a claim can outrun its
  publish on Aerospike). A slot the peek skipped is passed when it holds an ack's tombstone or a seal
  (`Storage.settled`), or its write deadline is known to be over: it is at or below a fire pointer seen
  at least `write_grace_ms` ago, or a later record of the shard was claimed that long ago (claims go in
  slot order, so the slot was allocated before). Otherwise the pointer stops there (a time boundary):
  passing it could leave a late write, or the claim of the consumer awaiting it, behind the pointer
  for good;
* no fireTS → a claim whose stamp is a moment away or a write that landed after its slot was skipped
  as a hole: stamp it (only if still unstamped) and stop there, so it is swept one sweepDuration later
  and a live claim is never disturbed;
* fireTS ≥ cutoff → stop (time boundary);
* otherwise move it to the sideline (reason `swept`): copy, and only then delete from main.

The move is fenced by the leader's epoch as part of its writes (`Storage.move`): a leader paused after
reading a batch that resumes once a newer one has taken over copies and deletes nothing. After each
batch the shard's pointer and the swept counter are advanced in one fenced, forward-only store call
carrying the epoch: a stale leader gets StaleEpoch and stops at once. The main
magazine's cutoff is `now - sweepDuration`; the sideline is swept into its own tail with
`min(now - sweepDuration, now - 2 x shovelInterval)` (a message the shovel just claimed is in flight).
A failure on one shard or magazine is counted and logged and does not stop the others.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

from ignis import names
from ignis.envelope import CODEC_UNREADABLE, Envelope, now_ms
from ignis.errors import QueueNotFound, StaleEpoch, StoreUnavailable
from ignis.logs import one_line
from ignis.magazine import Magazine
from ignis.outage import store_failed
from ignis.queue import Queue
from ignis.spec import QueueSpec
from ignis.storage.base import MagazineKind, SlotRef, Storage, client_view
from ignis_workers.metrics import STAMPED, SWEEP_DURATION, SWEEP_EXAMINED, SWEEP_FAILURES, SWEPT

log = logging.getLogger(__name__)

SWEEP_BATCH_SIZE = 1000
PARALLEL_FACTOR = 64
SWEPT_REASON = "swept"
SHARD_GROUP_MIN_SLOTS = 2_000  # slots to examine per shard group, at least, before a magazine is split
# A record a sweep stamped that no claim has stamped since, this long after: its claim is gone (see _round).
UNCLAIMED_AFTER_MS = 2_000
# Slots all rounds of one sweeper hold at once, whatever the backlog, the shards and the threads: a round holds
# its window's records (the client's answers, envelopes, their copies) until its moves end. Without the bound a
# pass held shards x batch_size of them (512,000 at 512 shards). One window by default: measured on Aerospike
# (bench/bench_memory.py, 200-byte messages), the sweeper's private memory peaked 3 MiB over its idle size with
# 1,000 slots held, 26 MiB with 2,000 and 81 MiB with 4,000 (several rounds at once, on threads whose malloc
# arenas each keep what they held), while a pass over 60,000 abandoned claims took as long (6 s against 5-8 s on
# this 2-core machine). A sweeper of a big cluster may trade memory for rounds side by side: the setting
# IGNIS_SWEEPER_SLOTS_IN_MEMORY.
SWEEP_SLOTS_IN_MEMORY = 1_000
GC_YOUNG_THRESHOLD = 10_000  # allocations between young collections in a sweeping process (Python's default: 700)


def tune_collector() -> None:
    """Collector settings for a process that sweeps: call it once, at the process's start (`ignis sweeper`,
    `ignis sweep`, `ignis up`). A round holds a few container objects per record it moves (envelopes, bins,
    the client's batch records) until the round ends, so with Python's default young-generation threshold
    of 700 the cyclic collector runs every few dozen records and carries the whole round through its
    generations again and again: a third of the sweep's CPU on Aerospike (bench/README.md). Reference
    counting frees all of it anyway; only reference cycles wait for the collector, and with this threshold
    they wait 10,000 allocations instead of 700 ("When the number of allocations minus the number of
    deallocations exceeds threshold0, collection starts", Python docs, gc.set_threshold). Never lowers a
    threshold set higher by the host process, nor turns a disabled collector (threshold 0) on."""
    young, middle, old = gc.get_threshold()
    if 0 < young < GC_YOUNG_THRESHOLD:
        gc.set_threshold(GC_YOUNG_THRESHOLD, middle, old)


class LeadershipLost(Exception):
    """The guard said this process no longer leads: stop sweeping at once."""


@dataclass
class MagazineSweep:
    """What one sweep of one magazine of a queue did."""

    examined: int = 0  # slots passed (acked, swept) — the pointer advance
    moved: int = 0  # records copied to the sideline and deleted here
    stamped: int = 0  # unfired records stamped (time boundary set)
    failed_shards: list[int] = field(default_factory=list)
    error: str | None = None
    seconds: float = 0.0


@dataclass
class SweepReport:
    client_id: str
    queue: str
    main: MagazineSweep = field(default_factory=MagazineSweep)
    sideline: MagazineSweep = field(default_factory=MagazineSweep)
    cursor: MagazineSweep = field(default_factory=MagazineSweep)  # a subscription's claims of its topic's messages
    error: str | None = None  # the queue could not be swept at all

    @property
    def moved(self) -> int:
        return self.main.moved + self.sideline.moved + self.cursor.moved

    @property
    def ok(self) -> bool:
        return self.error is None and not any(m.error or m.failed_shards
                                              for m in (self.main, self.sideline, self.cursor))

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class Sweeper:
    """Sweeps queues on a fixed thread pool, one task per queue. Thread-safe.

    `epoch_source()` gives the fencing epoch of the current leadership; `guard()` is asked before every
    batch and raising LeadershipLost when it says False; `clock()` is epoch milliseconds."""

    def __init__(self, store: Storage, *, epoch_source: Callable[[], int], clock: Callable[[], int] = now_ms,
                 threads: int = PARALLEL_FACTOR, batch_size: int = SWEEP_BATCH_SIZE,
                 guard: Callable[[], bool] = lambda: True, slots_in_memory: int = SWEEP_SLOTS_IN_MEMORY) -> None:
        if threads < 1 or batch_size < 1 or slots_in_memory < 1:
            raise ValueError(f"threads={threads}, batch_size={batch_size} and slots_in_memory={slots_in_memory} "
                             "must all be at least 1")
        self.store = store
        self.epoch_source = epoch_source
        self.clock = clock
        self.threads = threads
        self.batch_size = batch_size
        self.guard = guard
        self._pool: ThreadPoolExecutor | None = None
        self._shard_pool: ThreadPoolExecutor | None = None  # shard groups of one magazine (never nested)
        self._lock = threading.Lock()
        self._fire_seen = _FireHistory()
        # One shard's window is read whole, so a batch_size above the bound raises the bound to it.
        budget = max(slots_in_memory, batch_size)
        self._slots = _SlotBudget(budget)
        # Shard groups of one magazine that can hold a window at once: more would only wait for the budget, each on
        # a thread of its own, and every thread that ever allocated keeps a malloc arena of its own (glibc: up to
        # 8 per core), whose memory the process keeps: the private peak then grew with the backlog (measured:
        # 54 to 129 MiB on Aerospike from 10,000 to 1,000,000 messages, bench/bench_memory.py).
        self._groups_at_once = max(1, budget // batch_size)

    # ---- pool --------------------------------------------------------------------------------------
    def _executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="ignis-sweep")
            return self._pool

    def _shard_executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._shard_pool is None:
                self._shard_pool = ThreadPoolExecutor(self.threads, thread_name_prefix="ignis-sweep-shards")
            return self._shard_pool

    def close(self) -> None:
        with self._lock:
            pools, self._pool, self._shard_pool = (self._pool, self._shard_pool), None, None
        for pool in pools:
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)

    def _store_for(self, client_id: str) -> Storage:
        return client_view(self.store, client_id)

    def active_queues(self) -> list[tuple[str, str]]:
        """(clientId, queue) of every active queue of the farm: the client registry, then each client's
        active-index query."""
        found = []
        for client_id in self.store.list_clients():
            found.extend((client_id, r.name) for r in self._store_for(client_id).list_queues(True))
        return found

    def run_on_pool(self, tasks: list[tuple[str, str]], fn: Callable[[str, str], Any]) -> list[Any]:
        """Run fn(client, queue) for each task on the pool; re-raise StaleEpoch/LeadershipLost (after
        cancelling what has not started) so a deposed leader stops at once."""
        pool = self._executor()
        futures: list[Future[Any]] = [pool.submit(fn, c, q) for c, q in tasks]
        results = []
        stop: BaseException | None = None
        for f in futures:
            try:
                results.append(f.result())
            except (StaleEpoch, LeadershipLost) as exc:
                stop = stop or exc
                for other in futures:
                    other.cancel()
            except Exception:  # the per-queue function already isolates failures; belt and braces
                log.exception("sweeper task failed")
        if stop is not None:
            raise stop
        return results

    # ---- sweep ---------------------------------------------------------------------------------------
    def sweep_all(self) -> list[SweepReport]:
        """One pass over every active queue of the farm."""
        return self.run_on_pool(self.active_queues(), self.sweep_queue)

    def sweep_queue(self, client_id: str, queue_name: str) -> SweepReport:
        """Sweep one queue: main, then the sideline. Raises StaleEpoch / LeadershipLost (stop leading);
        any other failure is in the report."""
        report = SweepReport(client_id, queue_name)
        try:
            store = self._store_for(client_id)
            record = store.get_queue(queue_name)
            if record is None:
                raise QueueNotFound(queue_name, client_id)
            queue = Queue(store, QueueSpec.from_bins(queue_name, record.bins, client_id))
            epoch = self.epoch_source()
        except (StaleEpoch, LeadershipLost):
            raise
        except Exception as exc:
            _log_failure(f"sweep of {client_id}/{queue_name}", exc)
            SWEEP_FAILURES.labels(queue_name, "main").inc()
            report.error = f"{type(exc).__name__}: {one_line(exc)}"
            return report
        now = self.clock()
        sweep_ms = int(record.bins.get("sweepDuration", queue.spec.sweep_duration_seconds * 1000))
        shovel_ms = int(record.bins.get("shovelInterval", 0) or 0) * 1000
        main_cutoff = now - sweep_ms
        sideline_cutoff = min(now - sweep_ms, now - 2 * shovel_ms)
        magazines: list[tuple[MagazineKind, Magazine, int, MagazineSweep]] = [
            ("main", queue.main, main_cutoff, report.main),
            ("sideline", queue.sideline, sideline_cutoff, report.sideline)]
        if queue.spec.subscribe is not None:  # a subscription: the claims of its topic's messages too
            try:
                cursor = queue.cursor
            except Exception as exc:
                _log_failure(f"sweep of {client_id}/{queue_name}/cursor", exc)
                SWEEP_FAILURES.labels(queue_name, "cursor").inc()
                report.cursor.error = f"{type(exc).__name__}: {one_line(exc)}"
            else:
                magazines.append(("cursor", cursor, main_cutoff, report.cursor))  # type: ignore[arg-type]
        for kind, source, cutoff, out in magazines:
            self._sweep_magazine(queue, kind, source, record.sweep_pointers(kind), cutoff, now, epoch, out)
        return report

    def _sweep_magazine(self, queue: Queue, kind: MagazineKind, source: Magazine, stored: dict[str, int],
                        cutoff: int, now: int, epoch: int, out: MagazineSweep) -> None:
        """Rounds over the shards that have work: one window of `batch_size` slots per shard, then one
        sideline load, one delete and one fenced pointer advance for the whole round (IgnisMQ's shape:
        a few store calls per round, not per shard)."""
        started = time.perf_counter()
        try:
            pointers = source.pointers()
            grace = queue.store.write_grace_ms
            # Taken after the read: every slot up to these fire pointers was allocated before this time.
            settled = self._fire_seen.settled((queue.store.client_id, queue.name, kind), self.clock(), grace,
                                              {shard: p.fire for shard, p in pointers.items()})
            # shard -> [next slot to examine, fire pointer]
            todo = {}
            for shard in range(source.shards):
                pos = max(int(stored.get(names.shard_label(shard), 1)), 1)
                if pos <= pointers[shard].fire:
                    todo[shard] = [pos, pointers[shard].fire]

            def rounds(group: dict[int, list[int]], result: MagazineSweep) -> None:
                while group:
                    self._round(queue, kind, source, group, cutoff, now, epoch, result, settled, grace)

            # A big backlog is swept by groups of shards side by side (a queue is one task of the pool, and
            # one queue may hold most of what there is to sweep); each group advances its own shards'
            # pointers (forward-only map writes, so groups never undo each other).
            groups = self._groups(todo)
            if len(groups) == 1:
                rounds(groups[0], out)
            else:
                parts = [MagazineSweep() for _ in groups]
                futures = [self._shard_executor().submit(rounds, group, part) for group, part in zip(groups, parts,
                                                                                                      strict=True)]
                errors = [f.exception() for f in futures]
                for part in parts:
                    out.examined += part.examined
                    out.moved += part.moved
                    out.stamped += part.stamped
                    out.failed_shards += part.failed_shards
                    out.error = out.error or part.error
                stop = next((e for e in errors if isinstance(e, StaleEpoch | LeadershipLost)), None)
                failure = stop or next((e for e in errors if e is not None), None)
                if failure is not None:
                    raise failure
        except (StaleEpoch, LeadershipLost):
            raise
        except Exception as exc:
            self._failed(queue.name, kind, out, None, exc)
        finally:
            out.seconds = time.perf_counter() - started
            SWEEP_DURATION.labels(queue.name, kind).observe(out.seconds)

    def _groups(self, todo: dict[int, list[int]]) -> list[dict[int, list[int]]]:
        """The shards with work, in as many groups as there are threads and at least SHARD_GROUP_MIN_SLOTS of
        backlog each (a small backlog is one group: splitting it costs more calls than it saves), and no more than
        the slot budget lets hold a window at once (however big the backlog)."""
        backlog = sum(fire - pos + 1 for pos, fire in todo.values())
        count = max(1, min(len(todo), self.threads, backlog // SHARD_GROUP_MIN_SLOTS, self._groups_at_once))
        shards = sorted(todo)
        return [{shard: todo[shard] for shard in shards[i::count]} for i in range(count)]

    def _round(self, queue: Queue, kind: MagazineKind, source: Magazine, todo: dict[int, list[int]], cutoff: int,
               now: int, epoch: int, out: MagazineSweep, settled: dict[int, int], grace: int) -> None:
        if not self.guard():
            raise LeadershipLost(f"stopped sweeping {queue.name}: this process no longer leads")
        # The round's shards: windows adding up to at most the sweeper's slot budget (at least one shard); the
        # others wait for the next round, and the shards taken go to the back of the line.
        taken, slots = [], 0
        for shard, (pos, fire) in todo.items():
            window = min(self.batch_size, fire - pos + 1)
            if taken and slots + window > self._slots.capacity:
                break
            taken.append(shard)
            slots += window
        for shard in taken:
            todo[shard] = todo.pop(shard)
        with self._slots.held(slots):
            self._round_of(queue, kind, source, todo, taken, cutoff, now, epoch, out, settled, grace)

    def _round_of(self, queue: Queue, kind: MagazineKind, source: Magazine, todo: dict[int, list[int]],
                  taken: list[int], cutoff: int, now: int, epoch: int, out: MagazineSweep, settled: dict[int, int],
                  grace: int) -> None:
        store = queue.store
        advance: dict[int, int] = {}
        starts: dict[int, int] = {}
        abandoned: list[tuple[SlotRef, Envelope]] = []  # claims past the cutoff: to the sideline
        unclaimed: list[tuple[SlotRef, Envelope]] = []  # records whose claim the store lost: back to main
        unclaimed_after = max(grace, UNCLAIMED_AFTER_MS)
        for shard in taken:
            pos, fire = todo[shard]
            starts[shard] = pos
            last = min(fire, pos + self.batch_size - 1)
            next_pos = last + 1
            written = settled.get(shard, 0)  # every missing slot up to it is a hole for good
            seen = pos  # the first slot of the window not returned by the peek yet
            stamped_at: int | None = None  # the first record stamped here: the pointer stops there
            peeked: set[int] = set()
            try:
                for ref, env in store.peek(source.name, shard, pos, last):
                    peeked.add(ref.slot)
                    # Slots skipped before a record claimed over a write deadline ago were allocated before it,
                    # so their writes landed or never will: passed. Not a cursor's: a slot its cursor passed
                    # with no record may be a claim its dead claimer still owed (`_claim_stranded`), however old
                    # the claims after it (a claim moves the cursor first and writes its records last).
                    if stamped_at is None and ref.slot > max(seen, written + 1) and \
                            (kind == "cursor" or not (env.fire_ts and env.fire_ts <= now - grace)):
                        unsettled = self._first_unsettled(store, source.name, shard, max(seen, written + 1),
                                                          ref.slot - 1)
                        if unsettled is not None:  # a slot whose write may still land: a boundary
                            next_pos = unsettled
                            break
                    seen = ref.slot + 1
                    if not env.fire_ts and env.codec == CODEC_UNREADABLE:
                        abandoned.append((ref, env))  # not a message (no usable fireTS either): to the sideline
                        continue
                    if not env.fire_ts:
                        # Never swept on sight: stamp it (only if still unstamped), and the pointer stops at
                        # the first one. The scan goes on, so every unstamped record of the window gets its
                        # stamp in this pass and all of them are swept one sweepDuration later, not one
                        # sweepDuration each (a node change can leave many such claims in a shard).
                        if store.stamp_unfired(ref, now) is not None:
                            out.stamped += 1
                            STAMPED.labels(queue.name, kind).inc()
                            if stamped_at is None:
                                stamped_at = ref.slot
                        continue  # (deleted between peek and stamp: acked, pass)
                    if kind == "main" and not env.attempts and env.codec != CODEC_UNREADABLE:
                        # Stamped by a sweep and never claimed since (a claim counts an attempt): the store
                        # lost this slot's claim (a rollback put the record back, behind a fire pointer that
                        # moved past it). Once no claim's stamp can still be on its way, back to main's tail.
                        if env.fire_ts <= now - unclaimed_after:
                            unclaimed.append((ref, env))
                            continue
                        next_pos = ref.slot if stamped_at is None else stamped_at
                        break
                    if env.fire_ts >= cutoff:  # time boundary
                        next_pos = ref.slot if stamped_at is None else stamped_at
                        break
                    abandoned.append((ref, env))
                else:
                    if stamped_at is not None:
                        next_pos = stamped_at
                    elif last >= max(seen, written + 1):  # slots at the end of the window the peek skipped
                        unsettled = self._first_unsettled(store, source.name, shard, max(seen, written + 1), last)
                        if unsettled is not None:
                            next_pos = unsettled
                if kind == "cursor" and grace > 0 and next_pos > pos:
                    missing = [s for s in range(pos, min(next_pos, written + 1)) if s not in peeked]
                    stranded = self._claim_stranded(queue, source, shard, missing, now - grace)
                    if stranded is not None:
                        out.stamped += 1
                        STAMPED.labels(queue.name, kind).inc()
                        next_pos = min(next_pos, stranded)
            except Exception as exc:
                self._failed(queue.name, kind, out, shard, exc)
                del todo[shard]
                continue
            if next_pos > pos:  # nothing passed: no write, so a re-run over a boundary changes nothing
                advance[shard] = next_pos
            if next_pos <= last or next_pos > fire:
                del todo[shard]  # stopped at a boundary, or reached the fire pointer
            else:
                todo[shard][0] = next_pos
        # Copy first, delete only after the copy landed: a crash in between duplicates, never loses. Every
        # record swept from main was claimed (it is below the fire pointer), so it counts as delivered once
        # at least: one with no delivery counted lost its claim's stamp (a store rollback put it back), and
        # its next delivery is a redelivery, as at-least-once says.
        delivered = 1 if kind == "main" else 0
        moved = 0
        for target, items, fired_before, reason in ((queue.sideline, abandoned, cutoff, SWEPT_REASON),
                                                    (queue.main, unclaimed, None, None)):
            if items:
                moved += self._move(store, kind, target, [
                    (ref, env.fire_ts, env.for_transfer(reason, now, max(env.attempts, delivered)))
                    for ref, env in items], fired_before, epoch, advance, starts, todo, out)
        if advance:
            store.advance_sweep(queue.name, kind, epoch, advance, moved)
            if kind == "cursor":
                self._drop_settled(queue, source, advance, starts)
            examined = sum(advance[shard] - starts[shard] for shard in advance)
            out.examined += examined
            out.moved += moved
            SWEEP_EXAMINED.labels(queue.name, kind).inc(examined)
            if moved:
                SWEPT.labels(queue.name, kind).inc(moved)

    def _move(self, store: Storage, kind: MagazineKind, target: Magazine,
              moves: list[tuple[SlotRef, int | None, Envelope]], fired_before: int | None, epoch: int,
              advance: dict[int, int], starts: dict[int, int], todo: dict[int, list[int]], out: MagazineSweep) -> int:
        """One fenced move of a round's records into `target`; how many it moved. A record settled meanwhile is
        not moved, and its slot is passed. One its holder took over meanwhile (stamped again: a late write that
        landed, a prefetched message handed out late, a claim) is not moved either, and is a time boundary:
        the pointer must not pass a claim that may still be abandoned, or no later pass would look at it."""
        try:
            flags = target.move_in(epoch, moves, fired_before=fired_before)
            refused = [ref for (ref, _, _), ok in zip(moves, flags, strict=True) if not ok]
            if refused:
                for ref, env in zip(refused, store.read(refused), strict=True):
                    if env is not None and ref.shard in advance and ref.slot < advance[ref.shard]:
                        advance[ref.shard] = ref.slot
                        todo.pop(ref.shard, None)  # stopped at a boundary
                for shard in [shard for shard, to in advance.items() if to <= starts[shard]]:
                    del advance[shard]  # nothing passed after all
            return sum(flags)
        except StaleEpoch:
            raise
        except Exception as exc:
            for shard in sorted({ref.shard for ref, _, _ in moves}):
                self._failed(target.queue, kind, out, shard, exc)
                todo.pop(shard, None)
                advance.pop(shard, None)  # its pointer must not pass the records still in place
            return 0

    @staticmethod
    def _drop_settled(queue: Queue, cursor: Magazine, advance: dict[int, int], starts: dict[int, int]) -> None:
        """The acks' tombstones of a subscription's claims the pointer just passed, deleted (Storage.drop_settled):
        they told this sweep an acked slot from one a crashed claimer left unclaimed (`_claim_stranded`), and
        nothing reads them behind the pointer. Not worth failing the pass for: the next pass over them is gone
        with the pointer, so a failure leaves them to their TTL (said in the log)."""
        store = queue.store
        for shard, to in advance.items():
            try:
                store.drop_settled(cursor.name, shard, starts[shard], to - 1)
            except Exception as exc:
                _log_failure(f"drop the settled claims of {queue.name} shard {shard} (kept until their TTL)", exc)

    @staticmethod
    def _claim_stranded(queue: Queue, cursor: Magazine, shard: int, slots: list[int], passed_by: int) -> int | None:
        """A subscription's slots its cursor passed with no claim record, their write deadline over (Aerospike: a
        claimer that stopped between moving the cursor and writing the claims, or before its late claim records
        were due: ignis.storage.aerospike.deferred): those holding a message its filter selects are claimed here
        and counted as delivered once (they may have been: a consumer that dies on a message each time still
        reaches its maxDeliver). Stamped `passed_by` (now less the write deadline) or the cursor's last move if
        earlier: the cursor passed them no later than either, so they are swept one sweepDuration after their
        claim at the soonest, as a written claim is, and not one after this sweep found them (nor at the mercy of
        this sweeper's clock, should it run ahead of the claimer's). The first such slot (the pointer stops
        there), or None."""
        if not slots:
            return None
        store = queue.store
        refs = [SlotRef(cursor.name, shard, slot) for slot in slots]
        open_refs = [ref for ref, settled in zip(refs, store.settled(refs), strict=True) if not settled]  # (acked)
        if not open_refs:
            return None
        moved_at = store.cursor_moved_at(cursor.name, shard)
        stamp = passed_by if moved_at is None else min(passed_by, moved_at)
        claimed = store.restamp_cursor(open_refs, stamp, cursor.only, True)  # type: ignore[attr-defined]
        stamped = [c.ref.slot for c in claimed if c.envelope is not None]
        return min(stamped) if stamped else None

    @staticmethod
    def _first_unsettled(store: Storage, magazine: str, shard: int, first: int, last: int) -> int | None:
        """The first slot of first..last (all skipped by a peek) that is not settled for good: no record
        yet, or one that landed since the peek. None if every one holds an ack's tombstone or a seal."""
        refs = [SlotRef(magazine, shard, slot) for slot in range(first, last + 1)]
        for ref, settled in zip(refs, store.settled(refs), strict=True):
            if not settled:
                return ref.slot
        return None

    def _failed(self, queue: str, kind: str, out: MagazineSweep, shard: int | None, exc: Exception) -> None:
        where = f"{queue}/{kind}" + (f" shard {shard}" if shard is not None else "")
        _log_failure(f"sweep of {where}", exc)
        SWEEP_FAILURES.labels(queue, kind).inc()
        if shard is None:
            out.error = f"{type(exc).__name__}: {one_line(exc)}"
        else:
            out.failed_shards.append(shard)


class _SlotBudget:
    """The slots the rounds of one sweeper may hold at once: a round waits until its windows fit."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.free = capacity
        self._cond = threading.Condition()

    @contextlib.contextmanager
    def held(self, slots: int) -> Iterator[None]:
        slots = min(slots, self.capacity)
        with self._cond:
            self._cond.wait_for(lambda: self.free >= slots)
            self.free -= slots
        try:
            yield
        finally:
            with self._cond:
                self.free += slots
                self._cond.notify_all()


def _log_failure(what: str, exc: BaseException) -> None:
    """One line for a failure; an outage is said once for the whole process (ignis.outage), not per queue."""
    if isinstance(exc, StoreUnavailable):
        store_failed(what, exc)
    else:
        log.error("%s failed: %s: %s", what, type(exc).__name__, one_line(exc))


class _FireHistory:
    """Fire pointers seen by earlier passes, per magazine. A slot up to a fire pointer seen at time t was
    allocated before t, so once `t + write_grace_ms` has passed its write has landed or failed for good:
    a missing record there is a hole, never a write still to come."""

    # Per magazine, snapshots kept at least grace / (MAX_SNAPSHOTS / 2) apart: the history spans the grace however
    # often passes come. (It once kept the last 64 passes: with passes every 0.3 s and Aerospike's 21 s grace they
    # never reached back a grace, so no slot was ever settled, and a dead claimer's owed cursor slot stopped the
    # sweep pointer for good: the process kill test, found 2026-12-01.)
    MAX_SNAPSHOTS = 64

    def __init__(self) -> None:
        self._seen: dict[tuple[str, str, str], list[tuple[int, dict[int, int]]]] = {}
        self._lock = threading.Lock()

    def settled(self, key: tuple[str, str, str], now: int, grace_ms: int, fire: dict[int, int]) -> dict[int, int]:
        """Record `fire` as seen at `now` (unless a snapshot was kept less than a spacing ago: the answer is then an
        older, lower pointer, never a wrong one); per shard, the newest fire pointer kept at least `grace_ms` ago
        (the current one when there is no grace; shards never seen that long ago are absent)."""
        if grace_ms <= 0:
            return dict(fire)
        spacing = grace_ms // (self.MAX_SNAPSHOTS // 2)
        with self._lock:
            snapshots = self._seen.setdefault(key, [])
            if not snapshots or now - snapshots[-1][0] >= spacing:
                snapshots.append((now, dict(fire)))
            old = [i for i, (at, _) in enumerate(snapshots) if at <= now - grace_ms]
            if old:
                del snapshots[:old[-1]]  # keep the newest old enough and everything after it
            del snapshots[:-self.MAX_SNAPSHOTS]  # (a guard: spaced as above, about half of them span the grace)
            at, pointers = snapshots[0]
            return dict(pointers) if at <= now - grace_ms else {}

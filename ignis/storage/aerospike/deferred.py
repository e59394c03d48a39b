"""A subscription's claim records, written late: most never are (docs/aerospike/layout.md, "Late claim records").

A claim of a topic's slots moves the subscription's cursor and reads the messages (two round trips, as a queue's
claim); its claim records (fireTS, attempts) only tell the sweeper that a slot the cursor passed is held, and since
when. So they wait `claim_write_delay_ms`: an ack within it writes the slot's tombstone in their place (created: no
record was there), and a subscription that keeps up writes one record per message, as a queue does, not two. The
claims still open by then are written together, by one thread per connection; an operation that needs a claim's
record (a nack's move, a read of the claim) has it written first.

A process that dies with claims not written leaves slots its cursor passed with no record, as one stopped between
its cursor's move and its claim's write always did: the sweeper claims those once the write deadline
(`write_grace_ms`, at least twice this delay: config.py) has passed, counting them delivered once, and stamped no
later than their claim was, so they are swept as their claim would have been (workers: `_claim_stranded`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

from ignis.outage import Backoff

log = logging.getLogger(__name__)

Key = tuple[str, str, str]


class LateClaim(NamedTuple):
    """A claim record not written yet: its key, what it will hold, its TTL (seconds) and when it is due."""

    key: Key
    fire_ts: int
    attempts: int
    ttl: int
    due: float  # time.monotonic()


class DeferredClaims:
    """The claim records one connection owes, and the thread that writes them once due. `write` writes claim
    records (create only: a record there already, the sweeper's claim of a slot it found unclaimed, stays);
    `settle` writes acks' tombstones in place of claim records (create or replace). Both raise on failure."""

    def __init__(self, delay_ms: int, write: Callable[[list[LateClaim]], None],
                 settle: Callable[[list[LateClaim]], None]) -> None:
        self.delay = delay_ms / 1000
        self._write, self._settle = write, settle
        self.pending: dict[Key, LateClaim] = {}  # (insertion order: oldest first, nearly)
        self._writing: set[Key] = set()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._backoff = Backoff()

    def note(self, keys: Sequence[Key], fire_ts: int, attempts: int, ttl: int) -> None:
        """Claim records owed for `keys`, due `delay` from now."""
        due = time.monotonic() + self.delay
        with self._cond:
            if self._closed:
                closed = True
            else:
                closed = False
                for key in keys:
                    self.pending[key] = LateClaim(key, fire_ts, attempts, ttl, due)
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, name="ignis-late-claims", daemon=True)
                    self._thread.start()
        if closed:  # (closing: written at once)
            self._write([LateClaim(key, fire_ts, attempts, ttl, due) for key in keys])

    def settle(self, keys: Sequence[Key]) -> list[int]:
        """Acks of `keys`: the tombstones of those whose claim record is still owed are written in its place (one
        write per message, not two). The indexes of the others, to settle as usual (a claim being written is waited
        for first). On failure the claims are owed again (the ack raises; the message is delivered again)."""
        taken, rest = self._take(keys, writing=False)
        if taken:
            try:
                self._settle(taken)
            except BaseException:
                self._owe(taken)
                raise
        return rest

    def write_now(self, keys: Sequence[Key]) -> None:
        """Write the owed claim records among `keys` now: an operation that reads or changes them comes next."""
        batch, _ = self._take(keys, writing=True)
        if batch:
            self._flush(batch)

    def _take(self, keys: Sequence[Key], writing: bool) -> tuple[list[LateClaim], list[int]]:
        """The owed claims among `keys`, owed no more (`writing`: marked as being written), and the indexes of the
        keys that owe nothing; a claim the thread is writing is waited for first."""
        with self._cond:
            while self._writing and any(key in self._writing for key in keys):
                self._cond.wait()
            taken: list[LateClaim] = []
            rest: list[int] = []
            for i, key in enumerate(keys):
                claim = self.pending.pop(key, None)
                if claim is None:
                    rest.append(i)
                else:
                    taken.append(claim)
            if writing:
                self._writing.update(claim.key for claim in taken)
        return taken, rest

    def discard(self, key_prefix: str) -> int:
        """Forget the owed claims of a magazine being purged (keys starting with `key_prefix`)."""
        with self._cond:
            gone = [key for key in self.pending if key[2].startswith(key_prefix)]
            for key in gone:
                del self.pending[key]
        return len(gone)

    def close(self, timeout: float) -> None:
        """Write every owed claim record (a store's close): what fails is left to the sweeper, said in the log."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(timeout)
        with self._cond:
            while self._writing:
                if not self._cond.wait(timeout):
                    break
            batch = list(self.pending.values())
            self.pending.clear()
            self._writing.update(claim.key for claim in batch)
        if batch:
            try:
                self._flush(batch, owe_again=False)
            except Exception as exc:
                log.warning("%d subscription claim records not written at close (%s: %s): the sweeper claims their "
                            "slots after the write deadline, and they are delivered again", len(batch),
                            type(exc).__name__, exc)

    # ---- the writer thread ----------------------------------------------------------------------------
    def _run(self) -> None:
        tick = max(self.delay / 2, 0.01)
        wait = tick
        while True:
            with self._cond:
                if not self._closed:
                    self._cond.wait(wait)
                if self._closed:
                    return
                now = time.monotonic()
                batch: list[LateClaim] = []
                for claim in self.pending.values():
                    if claim.due > now:
                        break
                    batch.append(claim)
                for claim in batch:
                    del self.pending[claim.key]
                self._writing.update(claim.key for claim in batch)
            wait = tick
            if not batch:
                continue
            try:
                self._flush(batch)
            except Exception as exc:
                wait = self._backoff.failed("write subscription claim records", exc)
            else:
                if self._backoff.failing:
                    self._backoff.ok()

    def _flush(self, batch: list[LateClaim], owe_again: bool = True) -> None:
        """Write `batch` (marked as being written by the caller); on failure they are owed again."""
        written = False
        try:
            self._write(batch)
            written = True
        finally:
            with self._cond:
                self._writing.difference_update(claim.key for claim in batch)
                if not written and owe_again:
                    for claim in batch:
                        self.pending.setdefault(claim.key, claim)
                self._cond.notify_all()

    def _owe(self, claims: list[LateClaim]) -> None:
        with self._cond:
            for claim in claims:
                self.pending.setdefault(claim.key, claim)

    def __repr__(self) -> str:
        return f"DeferredClaims(delay={self.delay}s, owed={len(self.pending)})"


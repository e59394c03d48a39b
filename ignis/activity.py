"""Which shards of a magazine have work, shared by every handle of that magazine in this process, and the
wake-up of consumers waiting for work (DESIGN §4: a consumer learns of a message within milliseconds).

One `ShardActivity` per (store, clientId, magazine) per process (`activity_for`): a publish through any
handle marks its shard active and wakes the consumers waiting on the magazine at once, whichever `Queue`
object they hold; the watcher (ignis.watch) does the same for messages published by other processes. A
claim that finds a shard drained drops it, unless a load marked it since the claim began.

The active set is an immutable tuple, replaced only under the lock, so fires and loads read it without
locking. A shard marked by a *committing* ring (another process's publish rang the doorbell before its commit:
ignis.storage.lmdb.doorbell) stays listed through reads of the pointers until one shows it with work or a claim
finds it drained: a read made between that ring and that commit sees no work there, and no other ring follows.
Two tokens, each a fresh number from a counter (`next()` is atomic under the GIL, so a new value
never equals one read before):

* `last_load`: stored by a load *before* it checks that its shard is listed. A claimer that found a shard
  drained drops it only if no load stored a token since its claim began, and checks again after dropping
  it (a load that stored its token meanwhile may have seen the shard still listed and skipped adding it):
  a message published in this process never stays hidden from its consumers.
* `changes`: stored *after* the active set was updated, then waiters are notified. A waiter reads it before
  it looks for work and sleeps only while it is unchanged (checked under the lock): a mark that lands after
  the look either changed it before the check or finds the waiter registered and notifies it.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

_tokens = itertools.count(1)


class ShardActivity:
    """The shards of one magazine known to have work in this process, and its waiting consumers."""

    __slots__ = ("_cond", "_waiting", "active", "changes", "claiming", "committing", "followers", "fresh_until",
                 "invalidated", "last_load", "refreshed_at", "relays", "wakes")

    def __init__(self) -> None:
        self.active: tuple[int, ...] = ()
        self.last_load = 0
        self.changes = 0
        self.refreshed_at = float("-inf")  # when the active set was last read from the store (monotonic)
        self.fresh_until = float("-inf")  # the watcher vouches for the active set until then (monotonic)
        self.invalidated = 0  # a token of the last invalidate(): a read that began before it is stale
        self.committing: frozenset[int] = frozenset()  # marked by a ring before a commit a read may not see yet
        self._cond = threading.Condition(threading.Lock())
        self._waiting = 0
        # A topic's activity: the activities of its subscriptions' cursors, marked with every mark of this one (a
        # topic's shards are its cursors' shards). A cursor's: its subscription's main magazine's activity, woken
        # with every change of this one (its consumers wait there for either).
        self.followers: tuple[ShardActivity, ...] = ()
        self.wakes: tuple[ShardActivity, ...] = ()
        self.relays = False  # followers or wakes (one test of a bool on a publish's path, not two of tuples)
        self.claiming: frozenset[int] = frozenset()  # shards a claim of this process is on (claim_alone)

    def follow(self, leader: ShardActivity) -> None:
        """Be marked with every mark of `leader` (a cursor follows its topic)."""
        with leader._cond:
            if self not in leader.followers:
                leader.followers += (self,)
                leader.relays = True

    def wake_with(self, other: ShardActivity) -> None:
        """Wake `other`'s waiters with every change of this one (a cursor wakes its subscription's consumers)."""
        with self._cond:
            if other not in self.wakes:
                self.wakes += (other,)
                self.relays = True

    def poke(self, wake: int) -> None:
        """Count a change and wake `wake` waiters, without marking a shard (a cursor's change, for its queue: as
        many as its own change would, never all of them, or every consumer thread of a subscription claimed at once
        for each message, and all but one came back empty, slowing each other's calls threefold: measured)."""
        self.changes = next(_tokens)
        if self._waiting:
            with self._cond:
                self._cond.notify(wake)

    # ---- marks --------------------------------------------------------------------------------------
    def mark(self, shards: Iterable[int], committing: bool = False) -> None:
        """Shards that got work (a load committed, a watcher saw it): listed, and waiters woken. `committing`: a
        publisher rang before its commit, so they stay listed through reads of the pointers that cannot see it
        yet (see the module docstring)."""
        self.last_load = next(_tokens)  # before reading the active set: see the module docstring
        shards = tuple(shards)
        if committing:
            with self._cond:
                self.committing |= frozenset(shards)
        if any(shard not in self.active for shard in shards):
            with self._cond:
                self.active += tuple(shard for shard in set(shards) if shard not in self.active)
        self._changed(len(shards))
        for follower in self.followers:
            follower.mark(shards, committing)

    def mark_one(self, shard: int) -> None:
        # (mark((shard,)), inlined and lean: every publish comes here)
        token = self.last_load = next(_tokens)
        if shard not in self.active:
            with self._cond:
                if shard not in self.active:
                    self.active += (shard,)
            token = next(_tokens)  # `changes` after the active set changed; unchanged, the load's token is as fresh
        self.changes = token
        if self._waiting:
            with self._cond:
                self._cond.notify(1)
        if self.relays:
            for follower in self.followers:
                follower.mark_one(shard)
            for other in self.wakes:
                other.poke(1)

    def _changed(self, wake: int) -> None:
        """After the active set changed: wake `wake` waiters (one per shard marked: each can claim there; a
        consumer that claims more than one message keeps the rest for the others, who fire again when done)."""
        self.changes = next(_tokens)  # after the active set: see the module docstring
        if self._waiting:
            with self._cond:
                self._cond.notify(wake)
        for other in self.wakes:
            other.poke(wake)

    # ---- one claim per shard (a subscription's cursor) ------------------------------------------------------
    def claim_alone(self, shard: int) -> int | None:
        """Take `shard` for a claim, or, if another claim of this process is on it, another active shard no claim
        is on; None if there is none. Threads of one process that claim the same shard of a cursor at once queue
        for its environment's write lock, and all but the first find the message taken (measured: 0.77 empty
        claim writes a message at 1,000 msg/s, four consumer threads, each a turn of the group commit's committer
        thread). The second waits instead: `claimed` wakes it if the shard still has work."""
        with self._cond:
            claiming = self.claiming
            if shard in claiming:
                shard = next((other for other in self.active if other not in claiming), None)
                if shard is None:
                    return None
            self.claiming = claiming | {shard}
            return shard

    def claimed(self, shard: int) -> None:
        """A claim that `claim_alone` let on `shard` is over: wake a waiter if the shard still has work (the claim
        left some, or a load marked it meanwhile), since one may have waited for this claim."""
        with self._cond:
            self.claiming -= {shard}
            still = shard in self.active
        if still:
            self._changed(1)

    def suppress(self, shard: int, loads_seen: int) -> None:
        """A claim found `shard` drained: drop it, unless a load marked it since the claim began."""
        with self._cond:
            before = self.active
            if self.last_load == loads_seen and shard in before:
                self.active = tuple(s for s in before if s != shard)
                if self.last_load != loads_seen:  # a load raced the drop: undo it
                    self.active = before
                elif shard in self.committing:  # the claim saw past that commit (its write lock waited for it)
                    self.committing -= {shard}

    def before_read(self) -> tuple[int, tuple[int, ...], int]:
        """What `replace` needs to know of the moment before the store's pointers were read."""
        return self.last_load, self.active, self.invalidated

    def current(self, seen: tuple[int, tuple[int, ...], int]) -> bool:
        """Whether a read that began at `seen` (before_read()) is still current: no invalidate() came since."""
        return seen[2] == self.invalidated

    def replace(self, with_work: Iterable[int], seen: tuple[int, tuple[int, ...], int]) -> bool:
        """The active set as read from the store (shards whose load pointer is past the fire pointer), keeping
        what loads of this process marked after the read began (`seen`: before_read() from before it). A read
        that began before an invalidate() (a seek moved a cursor meanwhile) only adds what it found: it vouches
        for nothing, and the next fire reads the pointers itself. True if a shard was added."""
        loads_seen = seen[0]
        if not self.current(seen):
            with self._cond:
                before = self.active
                self.active += tuple(shard for shard in with_work if shard not in before)
                added = len(self.active) - len(before)
            if added:
                self._changed(added)
            return bool(added)
        with self._cond:
            marked = self.active  # (as it is now: with what loads marked during the read, which it may not show)
            self.active = tuple(with_work)
            if self.last_load != loads_seen:  # a load committed after the read began: keep what it marked
                self.active += tuple(shard for shard in marked if shard not in self.active)
            if self.committing:  # rung before a commit this read may not have seen: kept until a read shows it
                self.committing -= set(self.active)
                self.active += tuple(shard for shard in self.committing if shard not in self.active)
            self.refreshed_at = time.monotonic()
            added = [shard for shard in self.active if shard not in marked]  # (new to the waiters: wake them)
        if added:
            self._changed(len(added))
        return bool(added)

    def refresh_due(self, every: float) -> bool:
        """Whether a fire should read the pointers itself: not while the watcher keeps them fresh."""
        now = time.monotonic()
        return now - self.refreshed_at >= every and now >= self.fresh_until

    def invalidate(self) -> None:
        """Forget when the store was last read (and what the watcher vouched for): the next fire reads the
        pointers again, whatever a read already under way answers (`current`)."""
        self.invalidated = next(_tokens)
        self.refreshed_at = self.fresh_until = float("-inf")

    def vouch(self, until: float, seen: tuple[int, tuple[int, ...], int]) -> None:
        """The watcher vouches for the active set until `until` (monotonic), from a read that began at `seen`:
        not if an invalidate() came since (that read may predate what it invalidated)."""
        if self.current(seen):
            self.fresh_until = until

    # ---- waiting -------------------------------------------------------------------------------------
    def wait(self, seen: int, timeout: float) -> bool:
        """Sleep until a change after `seen` (a value of `changes` read before looking for work), a `wake()`,
        or `timeout` seconds. True if something changed or woke it."""
        with self._cond:
            if self.changes != seen:
                return True
            self._waiting += 1
            try:
                return self._cond.wait(timeout)
            finally:
                self._waiting -= 1

    def wake(self) -> None:
        """Wake every waiter (a consumer stopping)."""
        with self._cond:
            self._cond.notify_all()

    @property
    def waiting(self) -> int:
        return self._waiting


_registry: dict[tuple[str, str, str], ShardActivity] = {}
_registry_lock = threading.Lock()


def activity_for(location: str, client_id: str, magazine: str) -> ShardActivity:
    """The process's one ShardActivity of a magazine of the store at `location` (Storage.location)."""
    key = (location, client_id, magazine)
    found = _registry.get(key)
    if found is None:
        with _registry_lock:
            found = _registry.setdefault(key, ShardActivity())
    return found


def with_work(pointers: Mapping[int, Any]) -> list[int]:
    """The shards whose load pointer is past the fire pointer (ShardPointers per shard)."""
    return [shard for shard, p in pointers.items() if p.load > p.fire]


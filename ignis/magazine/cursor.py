"""A subscription's view of its topic: `CursorMagazine`, the magazine a subscription claims its topic's messages
from (ignis.topics).

Its name is the subscription's cursor (names.cursor_of): the store resolves its load pointer to the topic's, its
records to claims of the topic's slots joined to the messages, and its wake-ups to the topic's (a publish to the
topic marks the topic's shard activity, which every cursor of the topic in this process follows: ignis.activity).
Everything else is a magazine's: the active shards, the awaited slots of a two-step publish (re-read and sealed
through the topic), the prefetch for concurrent consumers, holes. What differs is the claim: `Storage.claim_cursor`
passes over the messages the subscription's filter does not select (a claim that took none of them has not
drained the shard) and counts what left the topic before the subscription came to it, which is reported here:
`ignis_subscription_expired_total` and one log line per gap.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from ignis import names
from ignis.activity import activity_for
from ignis.envelope import now_ms
from ignis.magazine.core import Magazine
from ignis.metrics import HOLES_SKIPPED, SUBSCRIPTION_EXPIRED
from ignis.storage.base import Claimed, ClaimInDoubt, ClaimInterrupted, SlotRef, Storage
from ignis.subjects import SubjectFilter

log = logging.getLogger("ignis.topics")


class CursorMagazine(Magazine):
    """The topic side of one subscription handle: claims through the subscription's cursor."""

    def __init__(self, store: Storage, subscription: str, topic: str, *, shards: int, ttl_seconds: int,
                 only: SubjectFilter, hole_budget: int = 512, refresh_seconds: float = 1.0) -> None:
        super().__init__(store, names.cursor_of(subscription, topic), queue=subscription, kind="cursor",
                         shards=shards, ttl_seconds=ttl_seconds, hole_budget=hole_budget,
                         refresh_seconds=refresh_seconds, only=only)
        self.topic = topic
        self.only = only
        self._expired = SUBSCRIPTION_EXPIRED.labels(subscription)
        self._in_gap: set[int] = set()  # shards whose last claim found messages gone (one log line per gap)
        # A publish to the topic, here (or rung from elsewhere), marks its shards for this cursor too.
        self._active_shards.activity.follow(activity_for(store.location, store.client_id, topic))

    @property
    def activity(self):  # type: ignore[no-untyped-def]
        """The cursor's shard activity (the queue's consumers are woken by its changes: ShardActivity.wake_with)."""
        return self._active_shards.activity

    def _claim_next(self, max_slots: int) -> list[Claimed] | None:
        """One claim through the cursor on a shard with work: None when no shard has work, [] when the claim took
        nothing (the shard drained, it is dropped; or the filter passed over what it looked at: it is not)."""
        if self._in_doubt:  # a claim whose answer was lost: its slots first (awaited: read and claimed again)
            resolved = self._resolve_in_doubt()
            if resolved:
                return resolved
        active_shards = self._active_shards
        loads_seen = active_shards.activity.last_load
        shard = active_shards.pick_alone()  # (not one another thread of this process claims: claim_alone)
        if shard is None:
            return None
        try:
            return self._claim_on(shard, max_slots, loads_seen)
        finally:  # (after a drained shard was dropped: the end of the claim wakes a waiter only for work left)
            active_shards.claimed(shard)

    def _claim_on(self, shard: int, max_slots: int, loads_seen: int) -> list[Claimed]:
        active_shards = self._active_shards
        try:
            # Caught up with the topic's load pointer as last seen: read it again, unless the watcher reads it
            # often enough to vouch for it (a consumer's wake-ups; each recheck was a round trip of an empty claim).
            recheck = time.monotonic() >= active_shards.activity.fresh_until
            result = self._store.claim_cursor(self.name, shard, max_slots, now_ms(), self.only, recheck=recheck)
        except (ClaimInDoubt, ClaimInterrupted) as exc:  # (as Magazine._claim_next)
            self._claim_failed(exc)
            raise
        if result.expired:
            self._lost(shard, result.expired)
        elif result.claimed and shard in self._in_gap:
            self._in_gap.discard(shard)
        if result.claimed:
            self._won.tick()
            if result.drained:  # it took the last message known: the next fire need not claim to find the shard empty
                active_shards.suppress(shard, loads_seen)  # (a load seen since keeps it: ShardActivity.suppress)
        elif result.drained:
            self._drained.tick()
            active_shards.suppress(shard, loads_seen)
        return result.claimed

    def _passed(self, holes: list[SlotRef], unwritten: Sequence[SlotRef] = ()) -> None:
        """Claimed topic slots that held nothing for good (awaited past the write deadline, then sealed): their
        message left the topic before this subscription came to it (counted as holes claimed, which the figures
        report as expired, and said once per gap), or, `unwritten`, it was never written (a publisher that stopped
        after reserving its slot, as the seal found): passed over as a publisher's own sealed reservation is,
        nothing lost."""
        skip = set(unwritten)
        lost = [ref for ref in holes if ref not in skip]
        if skip:
            HOLES_SKIPPED.labels(self.queue, self.kind).inc(len(holes) - len(lost))
        super()._passed(lost)
        for shard in {ref.shard for ref in lost}:
            self._lost(shard, sum(1 for ref in lost if ref.shard == shard))

    def _lost(self, shard: int, count: int) -> None:
        """Messages that left the topic before this subscription claimed them: counted, and said once per gap."""
        self._expired.inc(count)
        if shard not in self._in_gap:
            self._in_gap.add(shard)
            log.warning("subscription %s lost %d message(s) of topic %s (shard %d) to its retention: they left the "
                        "topic before the subscription came to them (it fell behind); counted in its figures as "
                        "expired", self.queue, count, self.topic, shard)

"""Prefetch of a magazine handle: messages one fire claimed, beyond what it asked for, for the other consumer
threads of the handle, kept claimed and stamped and handed out oldest first by the next fires (stamped again
when kept too long). Kept apart from the `Magazine` coordinator because who counts as a consumer, how much a
fire claims for them and when a kept message is stale are one concern with its own lock and timing
constants, which fires only consult: one `Prefetch` per handle.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from collections.abc import Sequence
from threading import get_ident as _thread_id

from ignis.storage.base import Claimed

PREFETCH_MAX = 64  # messages one fire claims for other threads of its handle, at most
PREFETCH_PER_FIRE = 8  # ... and per other consumer thread of the handle: each of them comes back for more
CONSUMER_RECENT_SECONDS = 0.1  # a thread that fired this recently counts as a consumer of the handle
PREFETCH_FRESH_SECONDS = 1.0  # a prefetched message kept longer is stamped again when handed out


# Prefetch for concurrent consumers: every claim costs a round trip to the meta record and one to
# the data, so a fire that sees other threads of this handle consuming claims for them too (eight
# more slots per other consumer, PREFETCH_MAX at most) and keeps the extra messages here, claimed
# and stamped, for the next fires of any thread. (57 per claim for eight threads, against 29 with
# four per consumer and at most 32, gave a few percent more throughput across rounds, measured.)
# The other consumers are the fires in progress beside it or, if more, the other threads that fired
# on the handle within CONSUMER_RECENT_SECONDS: those are busy with what they got (handling, acking)
# and come back for more; counting only the fires that overlap saw one or two of eight consumers and
# claimed half as much per call (measured). A lone consumer, or one slower than that per message,
# claims exactly what it asks for.
# A message kept longer than PREFETCH_FRESH_SECONDS is stamped again before it is handed out, so
# its sweep clock starts at delivery. A Consumer that stops hands the kept messages out first
# (take_kept); a process that dies leaves them to the sweeper, as any crashed consumer does.
class Prefetch:
    """The prefetched messages of one magazine handle (`kept`: (when claimed, claimed), oldest first) and the
    bookkeeping that sizes a fire's claim: the fires in progress and the threads that fired lately."""

    def __init__(self, enabled: bool) -> None:
        # Only consumers of the main magazine prefetch: the shovel fires the sideline with an exact budget.
        self.enabled = enabled
        self.kept: deque[tuple[float, Claimed]] = deque()  # (when claimed, claimed) for later fires
        self._firing = 0  # fires of this handle in progress, for the prefetch
        self._firing_lock = threading.Lock()
        self.consumers: dict[int, float] = {}  # thread -> when it last fired on this handle (monotonic)

    def fired(self) -> None:
        """The calling thread fires on the handle now (it counts as a consumer for a while)."""
        self.consumers[_thread_id()] = time.monotonic()

    def begin(self) -> int:
        """A fire starts: the calling thread fires on the handle now (as `fired`), and the other consumers it
        claims for (0 when this handle does not prefetch) are the fires in progress beside it or the other
        threads that fired lately (see above). Pair it with `end`. (Every fire comes here: one call.)"""
        if not self.enabled:
            with self._firing_lock:
                self._firing += 1
            return 0
        now = time.monotonic()
        consumers = self.consumers
        consumers[_thread_id()] = now
        with self._firing_lock:
            if len(consumers) > 1:
                recent = now - CONSUMER_RECENT_SECONDS
                # Over a copy, for a thread that starts firing adds itself without the lock, and a dict that grows
                # while it is walked raises "dictionary changed size during iteration". dict.copy() walks it
                # without running Python code, so no other thread can run meanwhile; tuple(consumers.items()) did
                # not do: each item's new tuple may start a garbage collection, whose finalizers run bytecode, at
                # which the interpreter switches threads (seen in CI, made to happen with gc.set_threshold(1)).
                for thread, at in consumers.copy().items():
                    if at < recent:
                        del consumers[thread]
            others = max(self._firing, len(consumers) - 1)
            self._firing += 1
        return others

    def end(self) -> None:
        """A fire `begin` counted is over."""
        with self._firing_lock:
            self._firing -= 1

    def keep(self, claimed: Sequence[Claimed]) -> None:
        """Keep messages a fire claimed beyond what it hands out, for the next fires."""
        self.kept.extend(zip(itertools.repeat(time.monotonic()), claimed))  # (C-level: no frame per message)

    def take_one(self) -> tuple[Claimed, bool] | None:
        """The oldest kept message and whether it is still fresh (else its caller stamps it again); None when
        none is kept."""
        try:
            at, item = self.kept.popleft()
        except IndexError:  # another thread took the last one
            return None
        return item, at >= time.monotonic() - PREFETCH_FRESH_SECONDS

    def take(self, n: int) -> tuple[list[Claimed], list[Claimed]]:
        """Up to n kept messages, oldest first: those still fresh, and those kept too long (to stamp again)."""
        out: list[Claimed] = []
        stale: list[Claimed] = []
        fresh_after = time.monotonic() - PREFETCH_FRESH_SECONDS
        while len(out) + len(stale) < n:
            try:
                at, item = self.kept.popleft()
            except IndexError:
                break
            (out if at >= fresh_after else stale).append(item)
        return out, stale

"""The canary gate of replay and redrive: publish the first N, wait until they are settled, go on only if
enough of them were acked.

Settled means gone from main: acked, or moved to the sideline or the dead letters (a failure). The watch
notes every magazine's load pointers before the canary is published, so afterwards it only reads the
slots loaded since, wherever the canary's messages went (found by id).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass

from ignis import names
from ignis.storage.base import Storage

PASS_RATIO = 0.95
POLL_SECONDS = 1.0


@dataclass
class CanaryReport:
    published: int
    acked: int
    failed: int  # sidelined or dead-lettered
    pending: int  # still in main (not delivered yet, or delivered and not settled) at the deadline
    seconds: float
    passed: bool

    @property
    def ratio(self) -> float:
        return self.acked / self.published if self.published else 1.0

    def as_dict(self) -> dict[str, object]:
        return {**asdict(self), "ackedRatio": round(self.ratio, 4)}

    def describe(self) -> str:
        return (f"canary of {self.published}: {self.acked} acked ({self.ratio:.1%}), {self.failed} sidelined or "
                f"dead-lettered, {self.pending} not settled after {self.seconds:.0f} s")


class CanaryWatch:
    def __init__(self, store: Storage, queue: str, shards: int) -> None:
        self.store = store
        self.magazines = {kind: name for kind, name in (("main", queue), ("sideline", names.sideline_of(queue)),
                                                         ("dead", names.dead_of(queue)))}
        self.shards = shards
        self.start = {kind: {s: p.load for s, p in store.pointers(name, shards).items()}
                      for kind, name in self.magazines.items()}

    def _ids_since_start(self, kind: str) -> set[str]:
        name = self.magazines[kind]
        found: set[str] = set()
        for shard, p in self.store.pointers(name, self.shards).items():
            first = self.start[kind][shard] + 1
            for at in range(first, p.load + 1, 4096):
                found.update(env.msg_id for _, env in self.store.peek(name, shard, at, min(p.load, at + 4095)))
        return found

    def wait(self, ids: Iterable[str], timeout: float, *, poll: float = POLL_SECONDS,
             sleep: Callable[[float], None] = time.sleep) -> CanaryReport:
        wanted = set(ids)
        began = time.monotonic()
        while True:
            in_main = wanted & self._ids_since_start("main")
            failed = wanted & (self._ids_since_start("sideline") | self._ids_since_start("dead"))
            elapsed = time.monotonic() - began
            if not in_main or elapsed >= timeout:
                acked = len(wanted - in_main - failed)
                return CanaryReport(len(wanted), acked, len(failed), len(in_main), elapsed,
                                    passed=not in_main and acked >= PASS_RATIO * len(wanted))
            sleep(poll)

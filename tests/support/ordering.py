"""Order checks of the ordered-queue tests: per key, the handlings (begin time, key, n) a consumer reported."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence


def order_violations(begins: Iterable[tuple[int, str, int]],
                     acks: Mapping[tuple[str, int], Sequence[int]] | None = None) -> list[str]:
    """Per key, each handling in time order: a begin of a lower n than one begun before; and, with `acks` ((key, n)
    -> ack times), a begin of n whose n-1 was not acked before it (a later message passing an unsettled earlier one).
    (Leave `acks` out where an ack may be applied and still fail, as in a store outage.)"""
    problems = []
    highest: dict[str, int] = defaultdict(lambda: -1)
    for at, key, n in sorted(begins):
        if n < highest[key]:
            problems.append(f"{key}: {n} handled after {highest[key]}")
        if acks is not None and n > 0 and not any(acked < at for acked in acks.get((key, n - 1), ())):
            problems.append(f"{key}: {n} begun before {n - 1} was acked")
        highest[key] = max(highest[key], n)
    return problems

"""The project's own error types. Every error names the thing that is wrong in one line."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class IgnisError(Exception):
    """Base of every IgnisMQ error."""


class InvalidSpecError(IgnisError, ValueError):
    """A queue spec or manifest breaks a rule. `problems` lists one line per violation."""

    def __init__(self, problems: list[str], source: str | None = None) -> None:
        self.problems = problems
        self.source = source
        where = f"{source}: " if source else ""
        super().__init__(where + "; ".join(problems))


class InvalidInputError(IgnisError, ValueError):
    """Bad input to an API or CLI call (not a queue spec)."""


class QueueNotFound(IgnisError, LookupError):
    def __init__(self, name: str, client_id: str) -> None:
        self.name = name
        self.client_id = client_id
        super().__init__(f"queue {name!r} not found (clientId {client_id!r}); apply its manifest first")


class TopicNotFound(IgnisError, LookupError):
    def __init__(self, name: str, client_id: str) -> None:
        self.name = name
        self.client_id = client_id
        super().__init__(f"topic {name!r} not found (clientId {client_id!r}); apply its manifest first")


class MessageNotFound(IgnisError, LookupError):
    """No message at a reference (Queue.read): never written, acked, expired, or out of the queue's shards."""

    def __init__(self, ref: str, why: str | None = None) -> None:
        self.ref = ref
        super().__init__(f"message {ref!r} not found" + (f" ({why})" if why else ""))


class QueueInactive(IgnisError):
    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(f"queue {name!r} is deactivated (active=false); re-apply its manifest to reactivate")


class PayloadTooLarge(IgnisError, ValueError):
    def __init__(self, size: int, limit: int, queue: str) -> None:
        self.size = size
        self.limit = limit
        super().__init__(
            f"payload of {size} bytes exceeds the maximum of {limit} bytes for queue {queue!r} "
            f"(set IGNIS_MAX_PAYLOAD_BYTES to change the limit)"
        )


class StoreError(IgnisError):
    """The store failed in a way that is not the caller's fault."""


class StoreUnavailable(StoreError):
    """The store cannot be reached or opened."""


class StoreFull(StoreError):
    """The store has no room left (lmdb map size, Aerospike device)."""


class StaleEpoch(StoreError):
    """A fenced write carried an epoch older than the one the store holds: another leader took over."""

    def __init__(self, queue: str, epoch: int, current: int) -> None:
        self.epoch = epoch
        self.current = current
        super().__init__(f"stale sweeper epoch {epoch} for queue {queue!r}: the store holds epoch {current}")


class HoleBudgetExceeded(IgnisError):
    """A fire call skipped more holes than its budget allows; data may remain, fire again."""

    def __init__(self, magazine: str, skipped: int) -> None:
        self.skipped = skipped
        super().__init__(f"fire on {magazine!r} skipped {skipped} holes in one call (budget reached)")


class AlreadySettled(IgnisError):
    """ack/nack called twice on the same delivered message."""


class LoadInterrupted(StoreUnavailable):
    """A load of several messages failed (an outage) after its slots were allocated and its writes sent: some
    may have landed. `refs` are the slots, in the order of the items loaded; `landed`, per slot, whether its
    write is known to have landed. Loading the items again would copy the landed ones twice: finish the load
    with `Storage.reload(magazine, refs, envelopes, landed, ...)`, which writes only what is not there."""

    def __init__(self, message: str, refs: Sequence[Any], landed: Sequence[bool]) -> None:
        self.refs = list(refs)
        self.landed = list(landed)
        super().__init__(message)


class QueueFull(IgnisError):
    """A publish to a bounded queue (QueueSpec.maxLength / maxBytes, overflow rejectPublish) found no room: nothing
    of the refused messages was written. For a batch (`publish_many`, `publish_each`), `refused` lists the indices
    of the messages refused and `results` has, per message in order, its MessageRef (stored) or None (refused); a
    single `publish` refuses its one message (refused == [0])."""

    def __init__(self, queue: str, why: str, refused: Sequence[int] = (0,),
                 results: Sequence[Any] | None = None) -> None:
        self.queue = queue
        self.why = why
        self.refused = list(refused)
        self.results = list(results) if results is not None else [None] * (max(self.refused, default=-1) + 1)
        total = len(self.results)
        what = "the message was refused, not written" if total <= 1 else \
            f"{len(self.refused)} of {total} messages were refused, not written (the others are stored)"
        super().__init__(f"queue {queue!r} is full ({why}): {what}; consume, or raise the queue's bound")

    @property
    def published(self) -> list[Any]:
        """The MessageRefs of the messages that were stored, in order."""
        return [r for r in self.results if r is not None]

"""Queue model: `QueueSpec` with every field of an IgnisQueue, its limits and defaults.

The same spec is read from an IgnisQueue manifest (camelCase, as users write it for kubectl),
built in Python (snake_case), and converted to and from the queue-metadata record bins of DESIGN §3.
Every violation becomes one line naming the field, the value and the rule.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.alias_generators import to_camel

from ignis.errors import InvalidSpecError

API_VERSION = "ignismq.io/v1alpha1"
KIND = "IgnisQueue"

ONE_YEAR_SECONDS = 365 * 24 * 3600
QUEUE_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
CLIENT_ID_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
HANDLER_TYPE_PATTERN = r"^[A-Za-z0-9]([A-Za-z0-9_.:/-]*[A-Za-z0-9])?$"


class DeletionPolicy(StrEnum):
    RETAIN = "Retain"
    DELETE = "Delete"


class _Model(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True, use_enum_values=False
    )


class ShovelSpec(_Model):
    """Moves sidelined messages back to the main magazine for redelivery."""

    enabled: bool = True
    concurrency: int = Field(4, ge=1, le=50)
    interval_seconds: int = Field(600, ge=0, le=86400)


class BatchingSpec(_Model):
    """Both fields are required: batching is on with both or off with neither."""

    max_batch_size: int = Field(ge=2, le=200_000)
    max_wait_seconds: int = Field(ge=1, le=300)


class RetrySpec(_Model):
    """Retries with backoff (README "Retries"): failed delivery n is redelivered after
    min(maxBackoffSeconds, minBackoffSeconds x multiplier^(n-1)); with `jitter`, after a wait drawn from
    [0, that] (full jitter). Without it a failed message goes to the sideline for the shovel."""

    min_backoff_seconds: float = Field(10.0, ge=0.001, le=ONE_YEAR_SECONDS)
    max_backoff_seconds: float = Field(600.0, ge=0.001, le=ONE_YEAR_SECONDS)
    multiplier: float = Field(2.0, ge=1, le=100)
    jitter: bool = False

    @model_validator(mode="after")
    def _ordered(self) -> RetrySpec:
        if self.min_backoff_seconds > self.max_backoff_seconds:
            raise ValueError(f"retry.minBackoffSeconds ({self.min_backoff_seconds:g}) must be <= "
                             f"retry.maxBackoffSeconds ({self.max_backoff_seconds:g})")
        return self

    def backoff_seconds(self, failed_delivery: int) -> float:
        """The wait before the next attempt after failed delivery `failed_delivery` (1 = the first), before
        jitter."""
        exponent = max(failed_delivery, 1) - 1
        try:
            wait = self.min_backoff_seconds * self.multiplier ** exponent
        except OverflowError:
            wait = self.max_backoff_seconds
        return min(self.max_backoff_seconds, wait)


class Overflow(StrEnum):
    """What a bounded queue (maxLength / maxBytes) does with a publish that finds it full (RabbitMQ's
    `x-overflow`): refuse it (QueueFull), or make room by moving the oldest unclaimed messages to the dead letters
    (reason `overflow`; never deleted silently)."""

    REJECT_PUBLISH = "rejectPublish"
    DROP_HEAD = "dropHead"


class StartPosition(StrEnum):
    EARLIEST = "earliest"  # everything the topic retains
    LATEST = "latest"  # only what is published after the subscription exists


class SubscribeSpec(_Model):
    """A subscription: the queue's messages come from a topic (ignis.topics). `filter` selects subjects (MQTT
    wildcards: `+` one level, `#` the remaining levels, last only); `start` is where a new subscription begins:
    `earliest`, `latest` (the default), or a time (ISO-8601, or epoch milliseconds) from which the retained log is
    replayed."""

    topic: str = Field(min_length=1, max_length=63, pattern=QUEUE_NAME_PATTERN)
    filter: str = Field("#", min_length=1, max_length=255)
    start: str | int = StartPosition.LATEST.value

    @model_validator(mode="after")
    def _valid(self) -> SubscribeSpec:
        from ignis.subjects import filter_problem

        problem = filter_problem(self.filter)
        if problem is not None:
            raise ValueError(f"subscribe.{problem}")
        start_ms(self.start)  # raises with the rule
        return self

    def start_ms(self) -> int | None:
        """The start as a time (epoch ms); None for earliest and latest."""
        return start_ms(self.start)

    def bins(self) -> dict[str, Any]:
        return {"subTopic": self.topic, "subFilter": self.filter, "subStart": str(self.start)}


def start_ms(start: str | int) -> int | None:
    """A subscription's start as epoch ms (None for earliest / latest); ValueError naming the rule otherwise."""
    if isinstance(start, bool):
        raise ValueError(f"subscribe.start={start!r}: must be earliest, latest, an ISO-8601 time or epoch ms")
    if isinstance(start, int):
        if start < 0:
            raise ValueError(f"subscribe.start={start}: epoch milliseconds must be >= 0")
        return start
    if start in (StartPosition.EARLIEST.value, StartPosition.LATEST.value):
        return None
    if start.isdigit():
        return int(start)
    try:
        moment = datetime.fromisoformat(start.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"subscribe.start={start!r}: must be earliest, latest, an ISO-8601 time "
                         "(2026-11-28T12:00:00Z) or epoch milliseconds") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


class QueueSpec(_Model):
    name: str = Field(min_length=1, max_length=63, pattern=QUEUE_NAME_PATTERN)
    handler_type: str = Field(min_length=1, max_length=100, pattern=HANDLER_TYPE_PATTERN)
    client_id: str | None = Field(None, min_length=1, max_length=40, pattern=CLIENT_ID_PATTERN)
    shards: int = Field(32, ge=1, le=512)
    queue_expiry_seconds: int = Field(30 * 24 * 3600, ge=1, le=ONE_YEAR_SECONDS)
    message_expiry_seconds: int = Field(7 * 24 * 3600, ge=1, le=ONE_YEAR_SECONDS)
    concurrency: int = Field(1, ge=0, le=100)
    shovel: ShovelSpec = Field(default_factory=ShovelSpec)
    sweep_duration_seconds: int = Field(1200, ge=300, le=18000)
    batching: BatchingSpec | None = None
    max_deliveries: int = Field(10, ge=0, le=1000)
    handler_timeout_seconds: int = Field(600, ge=1, le=1800)
    deletion_policy: DeletionPolicy = DeletionPolicy.RETAIN
    retry: RetrySpec | None = None
    subscribe: SubscribeSpec | None = None
    # Bounded queue (ignis.bounds): at most maxLength messages / maxBytes payload bytes waiting in main, each split
    # evenly across the shards; `overflow` says what a publish that finds no room does.
    max_length: int | None = Field(None, ge=1, le=10**12)
    max_bytes: int | None = Field(None, ge=1, le=10**15)
    overflow: Overflow = Overflow.REJECT_PUBLISH
    # Ordered delivery (ignis.magazine.ordered): at most one message of a shard in flight, so messages of a key
    # are handled in publish order. Immutable once set.
    ordered: bool = Field(False, strict=True)

    @model_validator(mode="after")
    def _cross_field_rules(self) -> QueueSpec:
        if self.ordered and self.subscribe is not None:
            raise ValueError("ordered: a subscription (subscribe) cannot be ordered yet; order its topic's "
                             "consumers with an ordered queue instead")
        if self.ordered and self.bounded:
            raise ValueError("ordered: a bounded queue (maxLength/maxBytes) cannot be ordered yet")
        for field, bound in (("maxLength", self.max_length), ("maxBytes", self.max_bytes)):
            if bound is not None and bound < self.shards:
                raise ValueError(
                    f"{field} ({bound}) must be >= shards ({self.shards}): the bound is split evenly across the "
                    "shards, and each shard must hold at least one message")
        if self.subscribe is not None and self.bounded:
            raise ValueError("maxLength/maxBytes are for a queue publishers write: a subscription's messages come "
                             "from its topic (bound the topic with retentionBytes)")
        if self.queue_expiry_seconds < self.message_expiry_seconds:
            raise ValueError(
                f"queueExpirySeconds ({self.queue_expiry_seconds}) must be >= messageExpirySeconds "
                f"({self.message_expiry_seconds}): a queue may not expire before its messages"
            )
        if self.retry is not None and self.retry.max_backoff_seconds > self.message_expiry_seconds:
            raise ValueError(
                f"retry.maxBackoffSeconds ({self.retry.max_backoff_seconds:g}) must be <= messageExpirySeconds "
                f"({self.message_expiry_seconds}): a retry may not wait longer than its message lives"
            )
        return self

    # ---- derived values -------------------------------------------------------------------
    @property
    def bounded(self) -> bool:
        """Whether the queue has a bound (maxLength or maxBytes)."""
        return self.max_length is not None or self.max_bytes is not None

    @property
    def effective_handler_timeout_seconds(self) -> float:
        """A handler must finish before the sweeper may re-home its message: cap at sweepDuration / 2."""
        return float(min(self.handler_timeout_seconds, self.sweep_duration_seconds / 2))

    @property
    def hold_ms(self) -> int:
        """How long a claim of an ordered queue holds its shard before the message may go to another consumer
        (a crashed one's): the effective handler timeout."""
        return round(self.effective_handler_timeout_seconds * 1000)

    @property
    def record_ttl_seconds(self) -> int:
        """Queue-metadata record TTL (DESIGN §3): queueExpiry x 2."""
        return self.queue_expiry_seconds * 2

    # ---- constructors ---------------------------------------------------------------------
    @classmethod
    def build(cls, source: str | None = None, /, **fields: Any) -> QueueSpec:
        """Validate fields (camelCase or snake_case); raise InvalidSpecError listing every problem."""
        try:
            return cls.model_validate(fields)
        except ValidationError as exc:
            raise InvalidSpecError(_describe(exc), source) from None

    @classmethod
    def from_manifest(cls, doc: Any, source: str | None = None) -> QueueSpec:
        """Read one IgnisQueue manifest (the YAML users give kubectl)."""
        if not isinstance(doc, dict):
            raise InvalidSpecError([f"manifest must be a mapping, got {type(doc).__name__}"], source)
        problems = []
        if doc.get("apiVersion") != API_VERSION:
            problems.append(f"apiVersion={doc.get('apiVersion')!r}: must be {API_VERSION!r}")
        if doc.get("kind") != KIND:
            problems.append(f"kind={doc.get('kind')!r}: must be {KIND!r}")
        metadata = doc.get("metadata")
        name = metadata.get("name") if isinstance(metadata, dict) else None
        if not name:
            problems.append("metadata.name: required (it is the queue name)")
        spec = doc.get("spec")
        if not isinstance(spec, dict):
            problems.append("spec: required mapping")
        if problems:
            raise InvalidSpecError(problems, source)
        fields = dict(spec)
        if "name" in fields:
            raise InvalidSpecError(["spec.name: not allowed; use metadata.name"], source)
        if "clientId" not in fields and "client_id" not in fields and isinstance(metadata, dict):
            # Kubernetes default: the owning application is the resource's namespace.
            namespace = metadata.get("namespace")
            if namespace:
                fields["clientId"] = namespace
        return cls.build(source, name=name, **fields)

    def to_manifest(self) -> dict[str, Any]:
        spec = self.model_dump(by_alias=True, mode="json", exclude={"name"}, exclude_none=True)
        return {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": self.name}, "spec": spec}

    # ---- record bins (DESIGN §3) ----------------------------------------------------------
    def config_bins(self) -> dict[str, Any]:
        """The config bins of the queue-metadata record; runtime bins are never part of this."""
        shovel_on = self.shovel.enabled
        return {
            "handlerType": self.handler_type,
            "shards": self.shards,
            "queueExpiry": self.queue_expiry_seconds,
            "messageExpiry": self.message_expiry_seconds,
            "concurrency": self.concurrency,
            "shovelConcur": self.shovel.concurrency if shovel_on else 0,
            "shovelInterval": self.shovel.interval_seconds if shovel_on else 0,
            "sweepDuration": self.sweep_duration_seconds * 1000,
            "maxBatchSize": self.batching.max_batch_size if self.batching else 0,
            "maxWaitTime": self.batching.max_wait_seconds if self.batching else 0,
            "maxDeliveries": self.max_deliveries,
            "handlerTimeout": self.handler_timeout_seconds * 1000,
            "deletionPolicy": self.deletion_policy.value,
            # only with retries: records of queues without them keep their layout
            **({"retryMinMs": round(self.retry.min_backoff_seconds * 1000),
                "retryMaxMs": round(self.retry.max_backoff_seconds * 1000),
                "retryMult": float(self.retry.multiplier), "retryJitter": int(self.retry.jitter)}
               if self.retry is not None else {}),
            # only for a subscription: a queue fed by a topic (ignis.topics)
            **(self.subscribe.bins() if self.subscribe is not None else {}),
            # only for a bounded queue (ignis.bounds); 0 = no bound of that kind
            **({"maxLength": self.max_length or 0, "maxBytes": self.max_bytes or 0, "overflow": self.overflow.value}
               if self.bounded else {}),
            # only for an ordered queue: records of other queues keep their layout
            **({"ordered": 1} if self.ordered else {}),
        }

    @classmethod
    def from_bins(cls, name: str, bins: dict[str, Any], client_id: str | None = None) -> QueueSpec:
        """Rebuild a spec from a stored record (e.g. written by the operator or another process)."""
        shovel_concur = int(bins.get("shovelConcur", 0) or 0)
        batch_size = int(bins.get("maxBatchSize", 0) or 0)
        wait = int(bins.get("maxWaitTime", 0) or 0)
        fields: dict[str, Any] = {
            "name": name,
            "handlerType": bins.get("handlerType"),
            "clientId": client_id,
            "shards": bins.get("shards", 32),
            "queueExpirySeconds": bins.get("queueExpiry"),
            "messageExpirySeconds": bins.get("messageExpiry"),
            "concurrency": bins.get("concurrency", 1),
            "shovel": (
                {"concurrency": shovel_concur, "intervalSeconds": int(bins.get("shovelInterval", 0) or 0)}
                if shovel_concur > 0
                else {"enabled": False}
            ),
            "sweepDurationSeconds": int(bins.get("sweepDuration", 1_200_000)) // 1000,
            "batching": (
                {"maxBatchSize": batch_size, "maxWaitSeconds": wait} if batch_size > 0 and wait > 0 else None
            ),
            "maxDeliveries": bins.get("maxDeliveries", 10),
            "handlerTimeoutSeconds": max(1, int(bins.get("handlerTimeout", 600_000) or 600_000) // 1000),
            "deletionPolicy": bins.get("deletionPolicy", "Retain"),
            "retry": (
                {"minBackoffSeconds": int(bins["retryMinMs"]) / 1000,
                 "maxBackoffSeconds": int(bins.get("retryMaxMs") or bins["retryMinMs"]) / 1000,
                 "multiplier": float(bins.get("retryMult") or 1.0), "jitter": bool(bins.get("retryJitter"))}
                if int(bins.get("retryMinMs", 0) or 0) > 0 else None
            ),
            "subscribe": (
                {"topic": bins["subTopic"], "filter": bins.get("subFilter") or "#",
                 "start": bins.get("subStart") or StartPosition.LATEST.value}
                if bins.get("subTopic") else None
            ),
            "maxLength": int(bins.get("maxLength") or 0) or None,
            "maxBytes": int(bins.get("maxBytes") or 0) or None,
            "overflow": bins.get("overflow") or None,
            "ordered": bool(bins.get("ordered")) or None,
        }
        return cls.build(f"stored record {name!r}", **{k: v for k, v in fields.items() if v is not None})


def ordered_change(name: str, ordered: bool, bins: Mapping[str, Any]) -> str | None:
    """The problem with declaring queue `name` with `ordered` over its stored record's `bins`, or None: ordered is
    immutable once the queue exists (its in-flight bookkeeping, the shards' holds, depends on it)."""
    stored = bool(bins.get("ordered"))
    if stored == ordered:
        return None
    return (f"ordered={str(ordered).lower()}: ordered is immutable (queue {name!r} was created with "
            f"ordered={str(stored).lower()}); create a new queue to change it")


def _describe(exc: ValidationError) -> list[str]:
    """One line per violation: `field=value: rule`."""
    lines = []
    for err in exc.errors(include_url=False):
        loc = ".".join(_camel(str(part)) for part in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "missing":
            lines.append(f"{loc}: required field is missing")
        elif err["type"] == "extra_forbidden":
            lines.append(f"{loc}: unknown field")
        elif err["type"] == "string_pattern_mismatch":
            rule = _PATTERN_RULES.get(loc, f"must match {err['ctx']['pattern']}")
            lines.append(f"{loc}={err.get('input')!r}: {rule}")
        elif not loc:  # model-level (cross-field) rule: the message names the fields itself
            lines.append(msg)
        else:
            lines.append(f"{loc}={err.get('input')!r}: {msg}")
    return lines


_PATTERN_RULES = {
    "name": "must be a lowercase DNS name: a-z, 0-9, '-' and '.', starting and ending alphanumeric",
    "clientId": "must be a lowercase DNS label: a-z, 0-9 and '-', starting and ending alphanumeric",
    "handlerType": "must be letters, digits and _ . : / -, starting and ending alphanumeric",
}


def _camel(part: str) -> str:
    return to_camel(part) if "_" in part else part

"""The options of the `ignis` Spark data source, parsed and checked once, on the driver side.

Every error names the option, the value and the rule. Credentials never travel in options (Spark shows
options in plans and logs): the store URL must not carry `user:password@`; executors read credentials
from their own environment or config file, as the library does (`IGNIS_AEROSPIKE_USER`, ...).
"""

from __future__ import annotations

import re
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ignis import names
from ignis.errors import InvalidInputError
from ignis.settings import load_settings
from ignis.subjects import filter_problem

MAGAZINE_KINDS = ("main", "sideline", "dead")
DEFAULT_SLOTS_PER_PARTITION = 100_000
DEFAULT_MAX_MESSAGES_PER_TRIGGER = 10_000
DEFAULT_CHUNK = 5_000  # messages per publish call of a write task (one group commit each)
_CREDENTIALS = re.compile(r"://[^/@?]*@")
KNOWN = frozenset({
    "store", "clientid", "farmid", "queue", "magazine", "since", "until", "slotsperpartition",
    "maxmessagespertrigger", "chunksize", "maxmessagespersecondpertask", "path", "delay",
    "topic", "startingtimestamp", "endingtimestamp", "subjectfilter",
})
KNOWN_NAMES = ("store, clientId, farmId, queue, topic, magazine, since, until, startingTimestamp, endingTimestamp, "
               "subjectFilter, slotsPerPartition, maxMessagesPerTrigger, chunkSize, maxMessagesPerSecondPerTask, "
               "delay")
# Options that only make sense for one of the two: a queue's magazines and load-time window, a write's delay; a
# topic's publish-time window (named as Spark's Kafka source names its own) and subject filter.
QUEUE_ONLY = {"magazine": "magazine", "since": "since", "until": "until", "delay": "delay"}
TOPIC_ONLY = {"startingtimestamp": "startingTimestamp", "endingtimestamp": "endingTimestamp",
              "subjectfilter": "subjectFilter"}


def parse_time(name: str, value: Any) -> int:
    """Epoch milliseconds from epoch ms (digits) or ISO-8601 (no zone = UTC)."""
    text = str(value).strip()
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    try:
        at = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        given = f"{name} {text!r}" if name.startswith("-") else f"option {name}={text!r}"  # a CLI flag, or an option
        raise InvalidInputError(f"{given}: not epoch milliseconds or an ISO-8601 time "
                                "(e.g. 2026-11-23T08:00:00Z)") from None
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    return int(at.timestamp() * 1000)


def _positive(options: Mapping[str, str], name: str, default: int) -> int:
    raw = options.get(name)
    if raw is None:
        return default
    try:
        value = int(str(raw))
    except ValueError:
        raise InvalidInputError(f"option {name}={raw!r}: not an integer") from None
    if value < 1:
        raise InvalidInputError(f"option {name}={value}: must be at least 1")
    return value


def _float_or_none(options: Mapping[str, str], name: str) -> float | None:
    raw = options.get(name)
    if raw is None:
        return None
    try:
        value = float(str(raw))
    except ValueError:
        raise InvalidInputError(f"option {name}={raw!r}: not a number") from None
    if value <= 0:
        raise InvalidInputError(f"option {name}={value}: must be above 0")
    return value


@dataclass(frozen=True)
class SourceOptions:
    """What a task needs to reach the store: picklable, credential-free."""

    store: str
    farm_id: str
    client_id: str
    queues: tuple[str, ...] | None  # None = every queue of the client ("*"); () for a topic read
    magazines: tuple[str, ...]
    since: int | None
    until: int | None
    slots_per_partition: int
    max_messages_per_trigger: int
    chunk_size: int
    rate_per_task: float | None
    delay_seconds: float | None  # writes: every row published this long after its task writes it
    planner_host: str  # where the driver side runs: an lmdb store is only reachable on this host
    topics: tuple[str, ...] = ()  # option topic: the topics whose retained logs are read (or written); () = queues
    starting: int | None = None  # topics: publish time from (epoch ms, inclusive)
    ending: int | None = None  # topics: publish time before (epoch ms, exclusive: Spark's Kafka endingTimestamp)
    subject_filter: str | None = None  # topics: an MQTT-style filter of the subjects read (ignis.subjects)

    @property
    def is_lmdb(self) -> bool:
        return self.store.startswith("lmdb:")

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        given = {str(k).lower(): v for k, v in options.items()}
        unknown = sorted(set(given) - KNOWN)
        if unknown:
            raise InvalidInputError(f"unknown option(s) {', '.join(unknown)} for format 'ignis'; known: {KNOWN_NAMES}")
        topic_given = given.get("topic") is not None and str(given["topic"]).strip() != ""
        queue_given = any(given.get(k) is not None and str(given[k]).strip() != "" for k in ("queue", "path"))
        if topic_given and queue_given:
            raise InvalidInputError("options queue and topic are both given: a read or write names queues (option "
                                    "queue) or topics (option topic), not both")
        if not topic_given and not queue_given:
            raise InvalidInputError("option queue (or topic) is missing: name one queue, a comma list, or * for every "
                                    "queue; or option topic: a topic, or a comma list of topics")
        for key, name in (QUEUE_ONLY if topic_given else TOPIC_ONLY).items():
            if given.get(key) is not None:
                raise InvalidInputError(_misplaced(name, topic_given))
        settings = load_settings()
        store = str(given.get("store") or settings.store)
        if _CREDENTIALS.search(store):
            raise InvalidInputError("option store: the URL carries credentials; options show up in Spark plans "
                                    "and logs, so give them as IGNIS_AEROSPIKE_USER / IGNIS_AEROSPIKE_PASSWORD "
                                    "(or the config file) on the driver and every executor instead")
        if store.startswith("lmdb:"):
            store = _absolute_lmdb(store)
        farm_id = names.check_id("farmId", str(given.get("farmid") or settings.farm_id))
        client_id = names.check_id("clientId", str(given.get("clientid") or settings.client_id))
        topics = topic_names(str(given["topic"]).split(","), "option topic") if topic_given else ()
        queues = () if topic_given else _queues(given.get("queue") or given.get("path"))
        magazine = str(given.get("magazine") or "main").strip().lower()
        if magazine == "all":
            magazines = MAGAZINE_KINDS
        elif magazine in MAGAZINE_KINDS:
            magazines = (magazine,)
        else:
            raise InvalidInputError(f"option magazine={magazine!r}: must be main, sideline, dead or all")
        since = parse_time("since", given["since"]) if given.get("since") is not None else None
        until = parse_time("until", given["until"]) if given.get("until") is not None else None
        if since is not None and until is not None and until < since:
            raise InvalidInputError(f"option until ({until}) is before since ({since})")
        starting = parse_time("startingTimestamp", given["startingtimestamp"]) \
            if given.get("startingtimestamp") is not None else None
        ending = parse_time("endingTimestamp", given["endingtimestamp"]) \
            if given.get("endingtimestamp") is not None else None
        if starting is not None and ending is not None and ending <= starting:
            raise InvalidInputError(f"option endingTimestamp ({ending}) is not after startingTimestamp ({starting}): "
                                    "the window [startingTimestamp, endingTimestamp) holds no publish time")
        subject_filter = None
        if given.get("subjectfilter") is not None:
            problem = filter_problem(str(given["subjectfilter"]))
            if problem is not None:
                raise InvalidInputError(f"option subjectFilter: {problem}")
            subject_filter = str(given["subjectfilter"])
        return cls(store=store, farm_id=farm_id, client_id=client_id, queues=queues, magazines=magazines,
                   since=since, until=until, topics=topics, starting=starting, ending=ending,
                   subject_filter=subject_filter,
                   slots_per_partition=_positive(given, "slotsperpartition", DEFAULT_SLOTS_PER_PARTITION),
                   max_messages_per_trigger=_positive(given, "maxmessagespertrigger",
                                                      DEFAULT_MAX_MESSAGES_PER_TRIGGER),
                   chunk_size=_positive(given, "chunksize", DEFAULT_CHUNK),
                   rate_per_task=_float_or_none(given, "maxmessagespersecondpertask"),
                   delay_seconds=_float_or_none(given, "delay"),
                   planner_host=socket.gethostname())

    @property
    def is_topic(self) -> bool:
        """A topic read or write (option topic), not a queue's."""
        return bool(self.topics)

    def single_topic(self, what: str) -> str:
        if len(self.topics) != 1:
            raise InvalidInputError(f"{what} needs option topic naming exactly one topic (got "
                                    f"{','.join(self.topics) or 'none'})")
        return self.topics[0]

    def single_queue(self, what: str) -> str:
        if self.queues is None or len(self.queues) != 1:
            raise InvalidInputError(f"{what} needs option queue naming exactly one queue (got "
                                    f"{'*' if self.queues is None else ','.join(self.queues) or 'none'})")
        return self.queues[0]


def _queues(raw: Any) -> tuple[str, ...] | None:
    if raw is None or not str(raw).strip():
        raise InvalidInputError("option queue is missing: name one queue, a comma list, or * for every queue")
    text = str(raw).strip()
    if text == "*":
        return None
    return queue_names(text.split(","), "option queue")


def queue_names(parts: Sequence[str], what: str) -> tuple[str, ...]:
    """Queue names, each checked (letters, digits and '-'; no '_', which names a queue's other magazines), in
    order, once each; blank parts (a trailing comma) are skipped. `what` names the input in the error."""
    found = tuple(dict.fromkeys(part.strip() for part in parts if part.strip()))
    for name in found:
        if "_" in name or not names.ID_PATTERN.match(name):
            raise InvalidInputError(f"{what}: {name!r} is not a queue name (lowercase letters, digits, '-')")
    return found


def topic_names(parts: Sequence[str], what: str) -> tuple[str, ...]:
    """Topic names, each checked (a topic is named as a queue is), in order, once each; blank parts skipped."""
    found = tuple(dict.fromkeys(part.strip() for part in parts if part.strip()))
    if not found:
        raise InvalidInputError(f"{what}: names no topic")
    for name in found:
        if name == "*":
            raise InvalidInputError(f"{what}: name the topics (one, or a comma list); * is for queues only")
        if "_" in name or not names.ID_PATTERN.match(name):
            raise InvalidInputError(f"{what}: {name!r} is not a topic name (lowercase letters, digits, '-')")
    return found


def _misplaced(option: str, topic: bool) -> str:
    if topic:
        hint = {"since": " (a topic read takes startingTimestamp)", "until": " (a topic read takes endingTimestamp)",
                "magazine": " (a topic has one log)", "delay": " (a topic's messages are never delayed)"}[option]
        return f"option {option} is for queues (option queue), not for option topic{hint}"
    hint = {"startingTimestamp": " (a queue read takes since)", "endingTimestamp": " (a queue read takes until)",
            "subjectFilter": ""}[option]
    return f"option {option} is for topics (option topic), not for option queue{hint}"


def _absolute_lmdb(url: str) -> str:
    """lmdb://relative/path resolved on the driver, so every task opens the same directory whatever its
    working directory."""
    import os

    rest = url[len("lmdb://"):]
    location, sep, query = rest.partition("?")
    if location and not location.startswith("/"):
        location = os.path.abspath(location)
    return f"lmdb://{location}{sep}{query}"

"""The checks of an `ignis pipeline` command's arguments that need no Spark: made before any of Spark is imported
or started, so bad usage is one `error:` line (exit 2; an unknown queue exit 3) within a moment, not after the
twenty seconds or more a SparkSession takes to start. Each raises InvalidInputError (or QueueNotFound) naming
the argument, the value and the rule.

What only Spark can judge (a --where condition, a path on a file system other than this host's) is still
reported by the job, as one line too.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from urllib.parse import urlsplit

from ignis.client import Ignis
from ignis.errors import InvalidInputError
from ignis_pipeline.options import parse_time, queue_names, topic_names


def queue_list(values: Sequence[str] | None, what: str = "QUEUE") -> list[str]:
    """The queues of a command's QUEUE arguments (each a name or a comma list; none, or `*` alone, = every queue
    of the client: []), each name checked."""
    parts = [part for value in values or () for part in value.split(",")]
    if [p.strip() for p in parts if p.strip()] == ["*"]:
        return []
    if "*" in (p.strip() for p in parts):
        raise InvalidInputError(f"{what}: * (every queue of the client) stands alone, not beside queue names")
    if parts and not any(p.strip() for p in parts):
        raise InvalidInputError(f"{what}: {','.join(values or ())!r} names no queue")
    return list(queue_names(parts, what))


def queue_name(value: str, what: str) -> str:
    """One queue name (a comma is no part of one)."""
    found = queue_names([value], what)
    if not found:
        raise InvalidInputError(f"{what}: {value!r} names no queue")
    return found[0]


def load_times(since: str | None, until: str | None) -> None:
    """--since and --until: epoch ms or ISO-8601, until not before since."""
    first = parse_time("--since", since) if since is not None else None
    last = parse_time("--until", until) if until is not None else None
    if first is not None and last is not None and last < first:
        raise InvalidInputError(f"--until {until} is before --since {since}")


def local_path(path: str) -> Path | None:
    """The local file a Spark path names (no scheme, or file:), None for any other file system."""
    parts = urlsplit(path)
    if parts.scheme in ("", "file") or (len(parts.scheme) == 1 and path[1:2] == ":"):
        return Path(parts.path if parts.scheme == "file" else path)
    return None


def new_output(to: str, overwrite: bool) -> None:
    """An export's --to: a local path that exists needs --overwrite (other file systems: the job checks)."""
    local = local_path(to)
    if local is not None and local.exists() and not overwrite:
        raise InvalidInputError(f"--to {to} already exists: add --overwrite to replace it, or choose another path")


def existing_input(source: str) -> None:
    """A replay's --from: a local export directory that is there (other file systems: the job checks)."""
    local = local_path(source)
    if local is not None and not local.exists():
        raise InvalidInputError(f"--from {source}: no such file or directory")


def require_queues(store: dict[str, str], queues: Sequence[str]) -> None:
    """QueueNotFound (exit 3) for the first named queue that does not exist: asked of the store, before Spark."""
    if not queues:
        return
    with Ignis(store["store"], farm_id=store["farmId"], client_id=store["clientId"], purge_interval=0) as ignis:
        for name in queues:
            ignis.record(name)


def topic_name(value: str, queues: Sequence[str] | None, magazine: object, subject_filter: str | None) -> str:
    """An export's --topic: one topic name, with no QUEUE arguments nor --magazine beside it (a topic has one log),
    and its --subject-filter checked."""
    if queues:
        raise InvalidInputError(f"--topic {value} and QUEUE arguments ({', '.join(queues)}): export a topic or queues, "
                                "not both")
    if magazine is not None:
        raise InvalidInputError("--magazine is for queues: a topic has one log (--topic exports it)")
    found = topic_names(value.split(","), "--topic")
    if len(found) != 1:
        raise InvalidInputError(f"--topic {value!r}: name one topic")
    if subject_filter is not None:
        from ignis.subjects import filter_problem

        problem = filter_problem(subject_filter)
        if problem is not None:
            raise InvalidInputError(f"--subject-filter: {problem}")
    return found[0]


def topic_times(since: str | None, until: str | None) -> None:
    """A topic export's --since and --until: epoch ms or ISO-8601, until after since (it is exclusive)."""
    first = parse_time("--since", since) if since is not None else None
    last = parse_time("--until", until) if until is not None else None
    if first is not None and last is not None and last <= first:
        raise InvalidInputError(f"--until {until} is not after --since {since} (a topic's window ends before --until)")


def require_topics(store: dict[str, str], topics: Sequence[str]) -> None:
    """TopicNotFound (exit 3) for the first named topic that does not exist: asked of the store, before Spark."""
    if not topics:
        return
    with Ignis(store["store"], farm_id=store["farmId"], client_id=store["clientId"], purge_interval=0) as ignis:
        for name in topics:
            ignis.topic_spec(name)

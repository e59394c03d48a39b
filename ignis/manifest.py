"""Read IgnisQueue and IgnisTopic manifests (the same YAML users give kubectl) from files and directories."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import yaml

from ignis.errors import InvalidSpecError
from ignis.spec import KIND, QueueSpec
from ignis.topics.spec import TOPIC_KIND, TopicSpec

T = TypeVar("T")

MANIFEST_SUFFIXES = (".yaml", ".yml")


def manifest_files(path: str | Path) -> list[Path]:
    """The manifest files at `path`: the file itself, or every *.yaml/*.yml under a directory, sorted."""
    p = Path(path)
    if p.is_dir():
        return sorted(f for f in p.rglob("*") if f.is_file() and f.suffix in MANIFEST_SUFFIXES)
    if p.is_file():
        return [p]
    raise InvalidSpecError([f"no such file or directory: {p}"])


def load_manifests(path: str | Path, *, skip_other_kinds: bool = True) -> list[QueueSpec]:
    """Every IgnisQueue in the file(s) at `path`, validated. Other kinds (a Namespace or the CRD itself in
    the same directory) are skipped. All documents are checked before any is returned, and every
    problem is reported with its file and document number, so nothing is applied half-way."""
    return _load(path, KIND, QueueSpec.from_manifest, "queue", skip_other_kinds)


def load_topic_manifests(path: str | Path, *, skip_other_kinds: bool = True) -> list[TopicSpec]:
    """Every IgnisTopic in the file(s) at `path`, validated, as load_manifests reads IgnisQueues."""
    return _load(path, TOPIC_KIND, TopicSpec.from_manifest, "topic", skip_other_kinds)


def _load(path: str | Path, kind: str, parse: Callable[[Any, str], T], noun: str, skip_other_kinds: bool
          ) -> list[T]:
    specs: list[T] = []
    problems: list[str] = []
    seen: dict[tuple[str | None, str], str] = {}
    for file in manifest_files(path):
        try:
            docs = list(yaml.safe_load_all(file.read_text(encoding="utf-8")))
        except (yaml.YAMLError, UnicodeDecodeError) as exc:
            problems.append(f"{file}: not valid YAML: {_first_line(exc)}")
            continue
        for index, doc in enumerate(docs, start=1):
            if doc is None:
                continue
            where = f"{file} (document {index})" if len(docs) > 1 else str(file)
            if skip_other_kinds and isinstance(doc, dict) and doc.get("kind") != kind:
                continue
            try:
                spec = parse(doc, where)
            except InvalidSpecError as exc:
                problems.append(str(exc))
                continue
            ident = (spec.client_id, spec.name)  # type: ignore[attr-defined]
            if ident in seen:
                problems.append(f"{where}: {noun} {spec.name!r} is also declared in {seen[ident]}")  # type: ignore[attr-defined]
                continue
            seen[ident] = where
            specs.append(spec)
    if problems:
        raise InvalidSpecError(problems)
    return specs


def _first_line(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__

"""Read IgnisQueue manifests (the same YAML users give kubectl) from files and directories."""

from __future__ import annotations

from pathlib import Path

import yaml

from ignis.errors import InvalidSpecError
from ignis.spec import KIND, QueueSpec

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
    specs: list[QueueSpec] = []
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
            if skip_other_kinds and isinstance(doc, dict) and doc.get("kind") != KIND:
                continue
            try:
                spec = QueueSpec.from_manifest(doc, where)
            except InvalidSpecError as exc:
                problems.append(str(exc))
                continue
            ident = (spec.client_id, spec.name)
            if ident in seen:
                problems.append(f"{where}: queue {spec.name!r} is also declared in {seen[ident]}")
                continue
            seen[ident] = where
            specs.append(spec)
    if problems:
        raise InvalidSpecError(problems)
    return specs


def _first_line(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__

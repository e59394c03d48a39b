"""The installed package version, for start-up log lines, `ignis --version` and info metrics."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version


def package_version() -> str:
    try:
        return version("ignismq")
    except PackageNotFoundError:  # running from a source tree without installing
        return "unknown"

"""CLI plug-ins: the parts built on the core (operator, sweeper, pipeline) add their commands to `ignis`
through the entry-point group `ignis.cli` (pyproject.toml), so the core never imports them.

A plug-in is a callable `register(app, groups)`: `app` is the root typer app, `groups` the core's
sub-command groups by name ("queue", "sideline"), for plug-ins that add a command there.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from importlib.metadata import entry_points

import typer

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "ignis.cli"


def load_plugins(app: typer.Typer, groups: Mapping[str, typer.Typer]) -> list[str]:
    """Register every installed plug-in's commands; a plug-in that fails to load is reported on stderr
    and skipped, so the core commands keep working. Returns the names of the plug-ins loaded."""
    loaded = []
    for entry in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        try:
            entry.load()(app, groups)
        except Exception as exc:  # a broken plug-in must not take the whole CLI down
            log.warning("CLI plug-in %r (%s) not loaded: %s: %s", entry.name, entry.value, type(exc).__name__, exc)
            continue
        loaded.append(entry.name)
    return loaded

"""The core (`ignis/`) knows none of its parts: operator/, workers/ and pipeline/ add their commands
through the `ignis.cli` entry points, and `ignis --help` still lists every command."""

from __future__ import annotations

import ast
import subprocess
import sys
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest
import typer

from ignis.cli import plugins

ROOT = Path(__file__).resolve().parent.parent
PARTS = ("ignis_operator", "ignis_workers", "ignis_pipeline")
IGNIS = Path(sys.executable).parent / "ignis"


def _imported_modules(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
    return found


def test_no_core_module_imports_a_part() -> None:
    offenders = {
        str(path.relative_to(ROOT)): sorted(m for m in _imported_modules(path) if m.split(".")[0] in PARTS)
        for path in sorted((ROOT / "ignis").rglob("*.py"))
    }
    assert {k: v for k, v in offenders.items() if v} == {}
    assert _imported_modules(ROOT / "ignis" / "cli" / "app.py") >= {"ignis.cli.plugins"}  # the check sees imports


def test_importing_the_whole_core_loads_no_part_but_the_cli_plugins() -> None:
    code = ("import importlib, pkgutil, sys, ignis\n"
            "for m in pkgutil.walk_packages(ignis.__path__, 'ignis.'):\n"
            "    if m.name != 'ignis.cli.app': importlib.import_module(m.name)\n"
            f"print(sorted(n for n in sys.modules if n.split('.')[0] in {PARTS!r}))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


def test_help_lists_the_core_and_every_plugin_command() -> None:
    out = subprocess.run([str(IGNIS), "--help"], capture_output=True, text=True, timeout=60,
                         env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    for command in ("queue", "publish", "consume", "sideline", "stats", "operator", "sweeper", "sweep", "up",
                    "pipeline"):
        assert f" {command} " in out.stdout, command
    pipeline = subprocess.run([str(IGNIS), "pipeline", "--help"], capture_output=True, text=True, timeout=60,
                              env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})
    for command in ("export", "replay", "redrive", "stats"):
        assert f" {command} " in pipeline.stdout, command
    # `pipeline --help` imports no pyspark: the CLI works without the spark extra.
    probe = subprocess.run([sys.executable, "-c", "import sys, ignis.cli.app; print('pyspark' in sys.modules)"],
                           capture_output=True, text=True, timeout=60, check=True)
    assert probe.stdout.strip() == "False"


def test_a_broken_plugin_is_reported_and_the_rest_still_load(monkeypatch: pytest.MonkeyPatch,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    good = EntryPoint("good", "ignis.cli.plugins:load_plugins", plugins.ENTRY_POINT_GROUP)
    broken = EntryPoint("broken", "no_such_module_anywhere:register", plugins.ENTRY_POINT_GROUP)
    calls: list[str] = []
    monkeypatch.setattr(plugins, "entry_points", lambda group: [broken, good] if group == plugins.ENTRY_POINT_GROUP
                        else [])
    app = typer.Typer()
    real_load = EntryPoint.load

    def load(self: EntryPoint):  # the broken one really fails to import; the good one records its call
        return real_load(self) if self.name == "broken" else (lambda app, groups: calls.append("good"))

    monkeypatch.setattr(EntryPoint, "load", load)
    assert plugins.load_plugins(app, {}) == ["good"]
    assert calls == ["good"]
    assert "plug-in 'broken'" in caplog.text and "no_such_module_anywhere" in caplog.text


def test_the_installed_entry_points_name_the_three_parts() -> None:
    from importlib.metadata import entry_points

    found = {e.name: e.value for e in entry_points(group=plugins.ENTRY_POINT_GROUP)}
    assert found == {"operator": "ignis_operator.cli:register", "workers": "ignis_workers.cli:register",
                     "pipeline": "ignis_pipeline.cli:register"}

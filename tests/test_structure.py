"""The code stays easy to change: no module over 800 lines, no class over 500, and no two modules that import
each other (directly or round a longer loop) in the core and its parts. Imports inside functions and under
`if TYPE_CHECKING:` count too: a cycle hidden in a function still ties the two modules together."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# folder -> the directory its importable packages live in
SOURCES = {"ignis": ROOT, "operator": ROOT / "operator", "workers": ROOT / "workers", "pipeline": ROOT / "pipeline"}
MAX_MODULE_LINES = 800
MAX_CLASS_LINES = 500


def _modules(base: Path, folder: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every .py under `folder` importable from `base`."""
    found = {}
    for path in sorted(folder.rglob("*.py")):
        parts = list(path.relative_to(base).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def all_modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for folder, base in SOURCES.items():
        found.update(_modules(base, ROOT / folder))
    return found


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the modules of `modules` it imports. `from package import name` is an edge to the submodule
    `package.name` when there is one, else to the package itself (the name is defined in its __init__)."""
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: list[str] = []
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.extend(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[:len(parts) - node.level + 1])
                    source = f"{base}.{node.module}" if node.module else base
                else:
                    source = node.module or ""
                targets.extend(f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules else source
                               for alias in node.names)
        deps = set()
        for target in targets:
            while target and target not in modules:  # `import a.b.c` where c is a name: the module is a.b
                target = target.rpartition(".")[0]
            if target and target != name:
                deps.add(target)
        graph[name] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def oversized(modules: dict[str, Path]) -> list[str]:
    found = []
    for name, path in modules.items():
        text = path.read_text()
        lines = len(text.splitlines())
        if lines > MAX_MODULE_LINES:
            found.append(f"module {name}: {lines} lines")
        for node in ast.walk(ast.parse(text, str(path))):
            if isinstance(node, ast.ClassDef):
                size = (node.end_lineno or node.lineno) - node.lineno + 1
                if size > MAX_CLASS_LINES:
                    found.append(f"class {name}.{node.name}: {size} lines")
    return found


def test_the_check_sees_every_part() -> None:
    modules = all_modules()
    for name in ("ignis.queue", "ignis_operator.handlers", "ignis_workers.sweeper", "ignis_pipeline.source"):
        assert name in modules, name
    graph = import_graph(modules)
    assert "ignis.errors" in graph["ignis.queue"]  # it reads the imports it should


def test_no_module_or_class_is_over_the_limits() -> None:
    assert oversized(all_modules()) == []


def test_no_import_cycle() -> None:
    assert cycles(import_graph(all_modules())) == []


def _write(root: Path, files: dict[str, str]) -> dict[str, Path]:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return _modules(root, root / "pkg")


def test_a_cycle_through_a_function_level_import_is_found(tmp_path: Path) -> None:
    modules = _write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": "from pkg.b import thing\n",
        "pkg/b.py": "from . import c\nthing = 1\n",
        "pkg/c.py": "def late():\n    from pkg import a\n    return a\n",
        "pkg/d.py": "import pkg.a\n",
    })
    assert cycles(import_graph(modules)) == [["pkg.a", "pkg.b", "pkg.c"]]


@pytest.mark.parametrize(("text", "expected"), [
    ("x = 1\n" * (MAX_MODULE_LINES + 1), ["module pkg.big: 801 lines"]),
    ("class Big:\n" + "    x = 1\n" * MAX_CLASS_LINES, ["class pkg.big.Big: 501 lines"]),
    ("class Fits:\n" + "    x = 1\n" * (MAX_CLASS_LINES - 1), []),
])
def test_the_limits_are_measured(tmp_path: Path, text: str, expected: list[str]) -> None:
    assert oversized(_write(tmp_path, {"pkg/__init__.py": "", "pkg/big.py": text})) == expected

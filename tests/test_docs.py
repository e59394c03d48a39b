"""The documentation site (mkdocs.yml, docs/): it builds with `mkdocs build --strict` (a broken link or anchor,
a page missing from the nav, a docstring mkdocstrings cannot render: all fail), its generated pages are current,
the CLI page names exactly the commands `ignis` has, and a newcomer reaches the pages issue 30 names in two
clicks."""

from __future__ import annotations

import html.parser
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urljoin, urlsplit

import pytest
import typer
import yaml

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"

# What a newcomer must find in two clicks (issue 30): the page, and the section on it.
TWO_CLICKS = {
    "install on Kubernetes": ("kubernetes/install.md", None),
    "publish from Python": ("python/index.md", None),
    "replay from Spark": ("pipeline/jobs.md", "replay"),
    "what to do when IgnisStoreRollback fires": ("runbook.md", "ignisstorerollback"),
}


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                           str(ROOT / "mkdocs.yml"), "--site-dir", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    problems = [line for line in done.stderr.splitlines() if line.startswith(("WARNING", "ERROR"))]
    assert done.returncode == 0 and not problems, "\n".join(problems) or done.stderr[-4000:]
    return out


def test_the_site_builds_strict_without_a_warning(site: Path) -> None:
    assert (site / "index.html").exists() and (site / "python" / "reference" / "index.html").exists()


def test_the_api_reference_is_generated_from_the_docstrings(site: Path) -> None:
    page = (site / "python" / "reference" / "index.html").read_text()
    for name in ("ignis.Ignis", "ignis.queue.Queue", "ignis.aio.AsyncIgnis", "ignis.consumer.Consumer"):
        assert f'id="{name}"' in page, name
    assert "A connection to one store, scoped to one clientId." in page  # Ignis's docstring


def test_every_image_of_the_site_is_there(site: Path) -> None:
    """The benchmark plots stay in bench/; the build hook puts them beside their pages."""
    images = 0
    for page in site.rglob("*.html"):
        for src in re.findall(r'<img [^>]*src="([^"]+)"', page.read_text()):
            if "://" in src or src.startswith("data:"):
                continue
            images += 1
            assert (page.parent / src).resolve().exists(), f"{page.relative_to(site)}: {src}"
    assert images
    assert (site / "benchmarks" / "latency.png").read_bytes() == (ROOT / "bench" / "latency.png").read_bytes()


def test_the_crd_reference_is_generated_from_the_crd() -> None:
    spec = importlib.util.spec_from_file_location("gen_crd_reference", DOCS / "gen_crd_reference.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    assert gen.is_current(ROOT), "docs/kubernetes/crd-reference.md is out of date: run python docs/gen_crd_reference.py"
    page = (DOCS / "kubernetes" / "crd-reference.md").read_text()
    for name in ("ignisqueues.ignismq.io.yaml", "ignistopics.ignismq.io.yaml"):
        crd = yaml.safe_load((ROOT / "crds" / name).read_text())
        section = page.split(f"## {crd['spec']['names']['kind']}\n", 1)[1].split("\n## ", 1)[0]
        schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        for part in ("spec", "status"):
            for field in schema["properties"][part]["properties"]:
                assert f"`{part}.{field}`" in section, (name, part, field)


# --- the CLI page against the CLI itself


def documented_commands() -> set[str]:
    """`ignis queue apply -f FILE` -> "queue apply": the lowercase words of each table row's command."""
    text = (DOCS / "cli.md").read_text()
    found = set()
    for row in re.findall(r"^\| `ignis ([^`]*)`", text, re.MULTILINE):
        words = []
        for token in row.split():
            if not re.fullmatch(r"[a-z][a-z-]*", token):
                break
            words.append(token)
        found.add(" ".join(words))
    return found


def cli_commands() -> set[str]:
    """Every command `ignis` runs (plug-ins included), as the space-separated path below `ignis`."""
    from ignis.cli.app import app

    def walk(group: Any, prefix: str) -> set[str]:  # typer's own (vendored) click Group
        paths = set()
        for name, command in group.commands.items():
            if command.hidden:
                continue
            if hasattr(command, "commands"):
                paths |= walk(command, f"{prefix}{name} ")
            else:
                paths.add(f"{prefix}{name}")
        return paths

    return walk(typer.main.get_command(app), "")


def test_the_cli_page_documents_every_command_and_no_other() -> None:
    documented, real = documented_commands(), cli_commands()
    assert "pipeline replay" in real and "operator" in real  # the plug-ins are loaded
    assert real - documented == set(), "commands missing from docs/cli.md"
    assert documented - real == set(), "docs/cli.md names commands ignis does not have"


def test_every_command_of_ignis_help_is_on_the_cli_page() -> None:
    done = subprocess.run([str(Path(sys.executable).parent / "ignis"), "--help"], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "COLUMNS": "200", "NO_COLOR": "1"})
    assert done.returncode == 0, done.stderr
    panel = done.stdout.split("Commands", 1)[1]
    listed = set(re.findall(r"^│ ([a-z][a-z-]*) {2,}", panel, re.MULTILINE))
    assert {"publish", "queue", "pipeline", "sweeper"} <= listed
    tops = {path.split()[0] for path in documented_commands()}
    assert listed - tops == set(), "top-level commands of `ignis --help` missing from docs/cli.md"
    assert tops - listed == set(), "docs/cli.md names top-level commands `ignis --help` does not list"


# --- two clicks


def nav_depths(nav: list[Any], depth: int = 1) -> dict[str, int]:
    """Page -> clicks from the top navigation: a top-level page is 1; a page in a top-level section is 2."""
    found: dict[str, int] = {}
    for entry in nav:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        if isinstance(value, list):
            found |= {page: d for page, d in nav_depths(value, depth + 1).items() if page not in found}
        else:
            found.setdefault(value, depth)
    return found


class _Links(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.in_article = 0
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "article":
            self.in_article += 1
        elif tag == "a" and self.in_article:
            self.hrefs.append(dict(attrs).get("href") or "")

    def handle_endtag(self, tag: str) -> None:
        if tag == "article":
            self.in_article -= 1


def site_url(page: str) -> str:
    """docs/pipeline/jobs.md -> pipeline/jobs/ (mkdocs' directory URLs)."""
    return "" if page == "index.md" else page.removesuffix(".md").removesuffix("/index") + "/"


@pytest.mark.parametrize("need", sorted(TWO_CLICKS))
def test_a_newcomer_finds_it_in_two_clicks(site: Path, need: str) -> None:
    page, anchor = TWO_CLICKS[need]
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    # By the navigation: a tab, then the page.
    assert nav_depths(config["nav"]).get(page, 99) <= 2, f"{need}: {page} is deeper than two clicks in the nav"
    # From the home page: one link in its text goes straight there.
    links = _Links()
    links.feed((site / "index.html").read_text())
    targets = {urljoin("https://site/", href) for href in links.hrefs}
    wanted = urljoin("https://site/", site_url(page)) + (f"#{anchor}" if anchor else "")
    assert wanted in targets, f"{need}: the home page has no link to {wanted}"
    # And the section is there.
    built = (site / urlsplit(site_url(page)).path / "index.html").read_text()
    if anchor:
        assert f'id="{anchor}"' in built, f"{need}: no section #{anchor} on {page}"

"""The README's two set-up commands are what CI and users run: keep them true. The README is the front page:
short, its example runs, and its links lead somewhere."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = text.split("```bash", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line and not line.startswith("#")]


def test_readme_opens_with_the_two_commands() -> None:
    main_job, tests = readme_commands()
    assert main_job.endswith("ignis up --demo")
    assert tests.endswith("pytest")


def test_ci_runs_exactly_the_readme_test_command() -> None:
    _, tests = readme_commands()
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert tests in ci


def test_getting_started_shows_the_same_two_commands() -> None:
    readme = (ROOT / "README.md").read_text().split("```bash", 1)[1].split("```", 1)[0]
    page = (ROOT / "docs" / "getting-started.md").read_text().split("```bash", 1)[1].split("```", 1)[0]
    assert page == readme


# The README's short example and the full one of the Python API page: each must run as written.
@pytest.mark.parametrize(("page", "heading"),
                         [("README.md", "## Python API"), ("docs/python/index.md", "# Python API")])
def test_the_python_api_example_runs(tmp_path: Path, monkeypatch, page: str, heading: str) -> None:
    monkeypatch.chdir(tmp_path)  # the example uses the default store, ./.ignis-data
    monkeypatch.delenv("IGNIS_STORE", raising=False)
    text = (ROOT / page).read_text()
    code = text.split(heading, 1)[1].split("```python", 1)[1].split("```", 1)[0]
    assert "consumer.run()" in code
    code = code.replace("consumer.run()", "assert consumer.drain(timeout=30)")  # run() waits for a signal
    exec(compile(code, page, "exec"), {})
    assert (tmp_path / ".ignis-data" / "data.mdb").exists()


def test_the_readme_is_a_front_page() -> None:
    """Under 300 lines (issue 30); the rest lives in docs/."""
    assert len((ROOT / "README.md").read_text().splitlines()) < 300


def test_every_relative_link_of_the_readme_exists() -> None:
    text = (ROOT / "README.md").read_text()
    targets = [t for t in re.findall(r"\]\(([^)\s]+)\)", text) if "://" not in t and not t.startswith("#")]
    assert targets
    missing = [t for t in targets if not (ROOT / t.split("#", 1)[0]).exists()]
    assert not missing, missing

"""The README's two set-up commands are what CI and users run: keep them true."""

from __future__ import annotations

from pathlib import Path

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


def test_the_python_api_example_runs(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # the example uses the default store, ./.ignis-data
    monkeypatch.delenv("IGNIS_STORE", raising=False)
    text = (ROOT / "README.md").read_text()
    code = text.split("## Python API", 1)[1].split("```python", 1)[1].split("```", 1)[0]
    assert "consumer.run()" in code
    code = code.replace("consumer.run()", "assert consumer.drain(timeout=30)")  # run() waits for a signal
    exec(compile(code, "README.md", "exec"), {})
    assert (tmp_path / ".ignis-data" / "data.mdb").exists()

"""`ignis pipeline` through the CLI (issue 45): bad usage of any command is one `error:` line with exit 2 (an
unknown queue: 3) before anything of Spark is imported or started; `stats` with no queue is every queue of the
client (an empty table on an empty store); and a command prints only its own output unless `--verbose` or
IGNIS_SPARK_LOG_LEVEL asks for Spark's logs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ignis import Ignis, QueueSpec

IGNIS = Path(sys.executable).parent / "ignis"


def _bad_usages(tmp: Path) -> list[tuple[list[str], str, int]]:
    """(argv after `ignis pipeline`, what the error line says, exit code): every kind of usage a command checks
    before Spark. `orders` exists in the store, `nope` does not."""
    exists = tmp / "exists"
    missing = tmp / "missing"
    return [
        (["stats", "Bad_Name"], "QUEUE: 'Bad_Name' is not a queue name", 2),
        (["stats", "orders,bad_one"], "QUEUE: 'bad_one' is not a queue name", 2),
        (["stats", ","], "QUEUE: ',' names no queue", 2),
        (["stats", "*", "orders"], "* (every queue of the client) stands alone", 2),
        (["stats", "--plot", str(tmp / "plot.svg")], "the file name must end in .png", 2),
        (["stats", "--bogus"], "No such option: --bogus", 2),
        (["stats", "nope"], "queue 'nope' not found", 3),
        (["--master", "foo", "stats"], "--master 'foo': not a Spark master URL", 2),
        (["--master", "local[0]", "stats"], "--master 'local[0]': not a Spark master URL", 2),
        (["--master", "spark://no-port", "export", "orders", "--to", str(missing)], "not a Spark master URL", 2),
        (["--conf", "novalue", "stats"], "--conf 'novalue': expected KEY=VALUE", 2),
        (["--conf", "spark.master=bogus", "stats"], "--conf spark.master= 'bogus': not a Spark master URL", 2),
        (["--master", "spark://spark-master:7077", "stats"], "with master spark://spark-master:7077: an lmdb store", 2),
        (["export", "orders"], "--to PATH is required", 2),
        (["export", "orders", "--to", str(exists)], f"--to {exists} already exists", 2),
        (["export", "orders", "--to", str(missing), "--since", "yesterday"], "--since 'yesterday': not epoch", 2),
        (["export", "--to", str(missing), "--since", "2026-01-02", "--until", "2026-01-01"], "is before --since", 2),
        (["export", "--to", str(missing), "--format", "xml"], "Invalid value for '--format'", 2),
        (["export", "nope", "--to", str(missing)], "queue 'nope' not found", 3),
        (["replay", "--from", str(exists)], "--from PATH and --to QUEUE are both required", 2),
        (["replay", "--from", str(missing), "--to", "orders"], f"--from {missing}: no such file or directory", 2),
        (["replay", "--from", str(exists), "--to", "Bad_Q"], "--to: 'Bad_Q' is not a queue name", 2),
        (["replay", "--from", str(exists), "--to", "a,b"], "--to: 'a,b' is not a queue name", 2),
        (["replay", "--from", str(exists), "--to", "orders", "--rate", "0"], "Invalid value for '--rate'", 2),
        (["redrive"], "Missing argument 'QUEUE'", 2),
        (["redrive", "bad_name"], "QUEUE: 'bad_name' is not a queue name", 2),
        (["redrive", "orders", "--from", "main"], "Invalid value for '--from'", 2),
        (["redrive", "nope"], "queue 'nope' not found", 3),
    ]


@pytest.fixture
def usage_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """An lmdb store holding queue `orders`, in the environment of the commands; an existing directory."""
    url = f"lmdb://{tmp_path}/store"
    with Ignis(url) as ignis:
        ignis.apply(QueueSpec.build(name="orders", handlerType="orders", shards=2))
    (tmp_path / "exists").mkdir()
    monkeypatch.setenv("IGNIS_STORE", url)
    monkeypatch.delenv("IGNIS_SPARK_LOG_LEVEL", raising=False)
    return url


def test_every_bad_usage_is_one_line_and_no_session(usage_store: str, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    import ignis_pipeline.session as session
    import ignis_pipeline.spark_logs as spark_logs

    from ignis.cli.app import run

    def never(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("Spark was started")

    monkeypatch.setattr(session, "build_session", never)
    monkeypatch.setattr(spark_logs, "start_jvm", never)
    for argv, words, code in _bad_usages(tmp_path):
        assert run(["pipeline", *argv]) == code, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("error: ") and words in err, (argv, err)
    monkeypatch.setenv("IGNIS_SPARK_LOG_LEVEL", "loud")  # a bad setting, on a command that is otherwise good
    assert run(["pipeline", "stats", "orders"]) == 2
    err = capsys.readouterr().err
    assert err == ("error: invalid settings: IGNIS_SPARK_LOG_LEVEL='loud': must be one of OFF, FATAL, ERROR, WARN, "
                   "INFO, DEBUG, TRACE, ALL\n")


def test_bad_usage_returns_without_importing_spark(usage_store: str, tmp_path: Path) -> None:
    """In a fresh process (no test session around): every bad usage is answered and pyspark was never imported,
    so no JVM can have started, and the real console script answers with one line."""
    code = ("import json, sys\n"
            "from ignis.cli.app import run\n"
            "cases = json.loads(sys.argv[1])\n"
            "codes = [run(['pipeline', *argv]) for argv, _, _ in cases]\n"
            "print(json.dumps({'codes': codes, 'spark': sorted(m for m in sys.modules if m.startswith('pyspark'))}))\n")
    cases = _bad_usages(tmp_path)
    proc = subprocess.run([sys.executable, "-c", code, json.dumps(cases)], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "IGNIS_STORE": usage_store})
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.splitlines()[-1])
    assert result["codes"] == [c for _, _, c in cases]
    assert result["spark"] == []  # nothing of Spark imported: no SparkSession, no JVM
    errors = proc.stderr.splitlines()
    assert len(errors) == len(cases) and all(line.startswith("error: ") for line in errors), errors
    for line, (argv, words, _) in zip(errors, cases, strict=True):
        assert words in line, (argv, line)
    one = subprocess.run([str(IGNIS), "pipeline", "stats", "Bad_Name"], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "IGNIS_STORE": usage_store})
    assert (one.returncode, one.stdout, one.stderr) == (
        2, "", "error: QUEUE: 'Bad_Name' is not a queue name (lowercase letters, digits, '-')\n")


def test_verbose_and_the_setting_choose_the_level_of_sparks_logs(usage_store: str,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    import ignis_pipeline.session as session
    from typer.main import get_command

    from ignis.cli.app import app

    chosen: list[str | None] = []

    class Stop(Exception):
        pass

    def record(*args: Any, log_level: str | None = None, **kwargs: Any) -> Any:
        chosen.append(log_level)
        raise Stop

    monkeypatch.setattr(session, "build_session", record)
    for env, flags, expected in ((None, [], "OFF"), (None, ["--verbose"], "WARN"), (None, ["-v"], "WARN"),
                                 ("info", [], "INFO"), ("info", ["-v"], "INFO"), ("error", ["-v"], "WARN"),
                                 ("Off", [], "OFF")):
        if env is None:
            monkeypatch.delenv("IGNIS_SPARK_LOG_LEVEL", raising=False)
        else:
            monkeypatch.setenv("IGNIS_SPARK_LOG_LEVEL", env)
        with pytest.raises(Stop):
            get_command(app).main(["pipeline", *flags, "stats", "orders"], prog_name="ignis", standalone_mode=False)
        assert chosen[-1] == expected, (env, flags)


def test_session_settings_log4j_and_loopback() -> None:
    from ignis_pipeline.spark_logs import LOG4J2_FILE, session_settings

    local = session_settings("local[2]", {"spark.ui.enabled": "false"}, "OFF")
    assert local["spark.driver.extraJavaOptions"] == (f"-Dlog4j2.configurationFile={LOG4J2_FILE.as_uri()} "
                                                      "-Dignis.spark.logLevel=OFF")
    assert LOG4J2_FILE.is_file()
    assert (local["spark.driver.host"], local["spark.driver.bindAddress"], local["spark.ui.enabled"]) == (
        "127.0.0.1", "127.0.0.1", "false")
    # The caller's own settings win: its JVM options stay (after ours), its log4j2 file is kept, its addresses too.
    theirs = session_settings("local[*]", {"spark.driver.extraJavaOptions": "-Dlog4j2.configurationFile=mine -Xss4m",
                                           "spark.driver.host": "10.0.0.5"}, "INFO")
    assert theirs["spark.driver.extraJavaOptions"] == ("-Dignis.spark.logLevel=INFO "
                                                       "-Dlog4j2.configurationFile=mine -Xss4m")
    assert theirs["spark.driver.host"] == "10.0.0.5"
    cluster = session_settings("spark://127.0.0.1:7077", {}, "OFF")
    assert "spark.driver.host" not in cluster and "spark.driver.bindAddress" not in cluster


def _spark_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.strip()]


def test_stats_with_no_queue_on_an_empty_store_prints_an_empty_table_and_nothing_of_spark(tmp_path: Path) -> None:
    """A real local Spark in a child process: exit 0, the table's header and no row on stdout, and nothing at all
    on stderr (no log4j line, no WARN, no JVM warning)."""
    env = {**os.environ, "IGNIS_STORE": f"lmdb://{tmp_path}/empty", "COLUMNS": "200"}
    env.pop("IGNIS_SPARK_LOG_LEVEL", None)
    env.pop("SPARK_LOCAL_IP", None)
    proc = subprocess.run([str(IGNIS), "pipeline", "--master", "local[1]", "stats"], capture_output=True,
                          text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert _spark_lines(proc.stderr) == []
    lines = proc.stdout.splitlines()
    assert any("queue" in line and "magazine" in line and "delayed" in line for line in lines), proc.stdout
    assert not [line for line in lines if line.startswith("│")]  # no row


def test_stats_with_no_queue_is_every_queue_and_verbose_shows_sparks_logs(tmp_path: Path) -> None:
    """Every queue of the client, with messages or not (one holds only delayed messages), in a child process with
    `--verbose`: Spark's own lines on stderr, and stdout still nothing but the JSON document."""
    url = f"lmdb://{tmp_path}/store"
    with Ignis(url) as ignis:
        for name in ("full", "empty", "later"):
            ignis.apply(QueueSpec.build(name=name, handlerType=name, shards=2))
        ignis.queue("full").publish_many([b"x"] * 3)
        ignis.queue("later").publish_many([b"y"] * 2, delay=600)
    env = {**os.environ, "IGNIS_STORE": url}
    env.pop("IGNIS_SPARK_LOG_LEVEL", None)
    proc = subprocess.run([str(IGNIS), "pipeline", "--verbose", "--master", "local[1]", "stats", "-o", "json"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [(r["queue"], r["magazine"], r["stored"], r["depth"], r["delayed"]) for r in json.loads(proc.stdout)
            ["magazines"]]
    assert rows == [("empty", "main", 0, 0, 0), ("full", "main", 3, 3, 0), ("later", "main", 0, 0, 2)]
    assert any(" WARN " in line for line in _spark_lines(proc.stderr)), proc.stderr  # Spark's, at WARN

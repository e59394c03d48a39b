"""Where an lmdb store can be used from: a job with a master whose executors may run on other hosts stops
before its SparkSession starts, with exit code 2 and one line (a session would first wait about a minute
for the master and then fail with a Java stack trace)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ignis import Ignis


def test_lmdb_with_a_cluster_master_is_refused_before_any_session(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    import ignis_pipeline.session as session

    from ignis.cli.app import run

    def never(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a SparkSession was started")

    monkeypatch.setattr(session, "build_session", never)
    monkeypatch.setenv("IGNIS_STORE", f"lmdb://{tmp_path}/store")
    for argv in (["--master", "spark://spark-master:7077", "stats"],
                 ["--conf", "spark.master=yarn", "export", "q", "--to", str(tmp_path / "x")],
                 ["--master", "k8s://https://10.0.0.1:6443", "redrive", "q"]):
        assert run(["pipeline", *argv]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(f"error: store lmdb://{tmp_path}/store with master "), err
        assert "only with a local master (local[*]) or a standalone master on this host's loopback" in err


def test_spark_submit_with_lmdb_and_a_remote_master_exits_2_before_connecting(ignis: Ignis, store_url: str,
                                                                           tmp_path: Path) -> None:
    if not store_url.startswith("lmdb:"):
        pytest.skip("about lmdb")
    import ignis_pipeline.jobs.stats as stats_job
    from pyspark.find_spark_home import _find_spark_home

    # A master that is not there: a session would wait for it (about a minute) and then fail with a Java error;
    # the job reads spark-submit's master and stops before it makes one.
    env = {**os.environ, "IGNIS_STORE": store_url, "PYSPARK_PYTHON": sys.executable}
    submit = Path(_find_spark_home()) / "bin" / "spark-submit"
    proc = subprocess.run([str(submit), "--master", "spark://spark-master.invalid:7077", "--conf",
                           "spark.ui.enabled=false", stats_job.__file__], capture_output=True, env=env, timeout=180)
    assert proc.returncode == 2, (proc.stdout + proc.stderr).decode()[-2000:]
    # (spark-submit passes on the Python driver's stderr on its stdout)
    output = proc.stdout.decode() + proc.stderr.decode()
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert errors == [f"error: store {store_url} with master spark://spark-master.invalid:7077: an lmdb store is one "
                      "directory on one host, so the ignis data source reads and writes it only with a local master "
                      "(local[*]) or a standalone master on this host's loopback address (spark://127.0.0.1:PORT); "
                      "use an aerospike:// store on a cluster"]

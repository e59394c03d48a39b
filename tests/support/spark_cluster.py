"""A Spark standalone cluster on this machine's loopback address, for the pipeline's cluster tests and
bench/bench_spark.py: one `org.apache.spark.deploy.master.Master` and N
`org.apache.spark.deploy.worker.Worker` processes started with the pyspark distribution's own
`bin/spark-class` (Java only, nothing to download). Executors are JVMs the workers start per
application, and their Python workers are processes of those JVMs: nothing runs in the test process.

    with standalone_cluster(tmp_path, workers=2) as cluster:
        spark = build_session("x", cluster.master_url, cluster.session_conf())

Ports are picked free; configuration, logs, work and scratch directories live under the given directory;
every wait is bounded; the processes (each in its own process group, with the executors and Python
workers they start) are always stopped.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HOST = "127.0.0.1"
START_TIMEOUT = 120.0  # seconds for the master and every worker to be up (JVM start-up on 2 busy cores)
STOP_TIMEOUT = 20.0
DAEMON_MEMORY = "256m"  # heap of the master and worker daemons themselves
EXECUTOR_MEMORY = "512m"  # an executor's heap (Spark's minimum is 450m)


def spark_home() -> Path:
    """The pyspark distribution's home: it carries bin/spark-class and the jars."""
    from pyspark.find_spark_home import _find_spark_home

    return Path(_find_spark_home())


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


@dataclass
class StandaloneCluster:
    master_url: str
    ui_url: str
    root: Path
    workers: int
    cores_per_worker: int
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)

    def status(self) -> dict[str, Any]:
        """The master's own JSON view: workers, applications (running and completed)."""
        with urllib.request.urlopen(f"{self.ui_url}/json/", timeout=5) as answer:
            return json.loads(answer.read())

    def session_conf(self, cores: int | None = None) -> dict[str, str]:
        """Settings of an application on this cluster: `cores` executor cores in all (default one per worker),
        one core and EXECUTOR_MEMORY each, the driver on loopback."""
        total = cores or self.workers
        return {"spark.executor.memory": EXECUTOR_MEMORY, "spark.executor.cores": "1", "spark.cores.max": str(total),
                "spark.driver.host": HOST, "spark.driver.bindAddress": HOST, "spark.ui.enabled": "false",
                "spark.default.parallelism": str(total), "spark.sql.shuffle.partitions": str(total)}

    def log_tail(self, lines: int = 40) -> str:
        out = []
        for path in self.logs:
            with contextlib.suppress(OSError):
                out.append(f"--- {path.name}\n" + "\n".join(path.read_text(errors="replace").splitlines()[-lines:]))
        return "\n".join(out)

    def stop(self) -> None:
        """SIGTERM each process group (a worker's executors and their Python workers with it), then SIGKILL
        what is left after STOP_TIMEOUT."""
        for proc in reversed(self.processes):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT
        for proc in reversed(self.processes):
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # the group: executors may outlive their worker
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        self.processes.clear()


def _wait(what: str, check: Any, cluster: StandaloneCluster, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for proc in cluster.processes:
            if proc.poll() is not None:
                raise RuntimeError(f"a Spark daemon exited ({proc.args[1]}, code {proc.returncode}) while waiting "
                                   f"for {what}:\n{cluster.log_tail()}")
        try:
            found = check()
        except (OSError, urllib.error.URLError, ValueError):
            found = None
        if found:
            return found
        time.sleep(0.5)
    raise TimeoutError(f"Spark standalone cluster: no {what} after {timeout:.0f} s:\n{cluster.log_tail()}")


@contextlib.contextmanager
def standalone_cluster(root: Path, workers: int = 2, cores_per_worker: int = 2, worker_memory: str = "1200m",
                       timeout: float = START_TIMEOUT) -> Iterator[StandaloneCluster]:
    """A master and `workers` workers on 127.0.0.1, up (every worker registered) when this yields."""
    home = spark_home()
    spark_class = home / "bin" / "spark-class"
    for sub in ("conf", "logs", "work", "local"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "SPARK_HOME": str(home), "SPARK_CONF_DIR": str(root / "conf"),
           "SPARK_LOG_DIR": str(root / "logs"), "SPARK_LOCAL_DIRS": str(root / "local"),
           "SPARK_DAEMON_MEMORY": DAEMON_MEMORY, "SPARK_LOCAL_IP": HOST, "SPARK_NO_DAEMONIZE": "1",
           # The executors' Python workers: this interpreter, as the driver's data source asks anyway.
           "PYSPARK_PYTHON": sys.executable}
    port, ui_port = free_port(), free_port()
    cluster = StandaloneCluster(f"spark://{HOST}:{port}", f"http://{HOST}:{ui_port}", root, workers,
                                cores_per_worker)

    def start(name: str, *args: str) -> None:
        log = root / "logs" / f"{name}.out"
        cluster.logs.append(log)
        with log.open("wb") as out:
            cluster.processes.append(subprocess.Popen(
                [str(spark_class), *args], stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=env, cwd=root, start_new_session=True))

    try:
        start("master", "org.apache.spark.deploy.master.Master", "--host", HOST, "--port", str(port),
              "--webui-port", str(ui_port))
        _wait("master", lambda: cluster.status().get("status") == "ALIVE", cluster, timeout)
        for i in range(workers):
            start(f"worker-{i}", "org.apache.spark.deploy.worker.Worker", "--host", HOST, "--port", "0",
                  "--webui-port", str(free_port()), "--cores", str(cores_per_worker), "--memory", worker_memory,
                  "--work-dir", str(root / "work" / f"worker-{i}"), cluster.master_url)
        _wait(f"{workers} workers", lambda: cluster.status().get("aliveworkers") == workers, cluster, timeout)
        yield cluster
    finally:
        cluster.stop()


def executor_count(spark: Any) -> int:
    """Executors registered with the session's driver (the driver itself not counted)."""
    return int(spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size()) - 1


def wait_for_executors(spark: Any, count: int, timeout: float = START_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while executor_count(spark) < count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {executor_count(spark)} of {count} executors registered after {timeout:.0f} s")
        time.sleep(0.5)

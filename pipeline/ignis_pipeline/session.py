"""The SparkSession of a job: `local[*]` by default, `--master URL` and `--conf k=v` passed through.

Under spark-submit the session's master and conf come from spark-submit (the job only adds its --conf).

Where the store can be reached from is checked before any session starts (`check_master`): an lmdb store
is a directory on one host, so it takes a master whose executors all run on this host: `local[...]`, or a
standalone master on this host's loopback address (`spark://127.0.0.1:PORT`: a test or single-machine
cluster). Any other master would be asked for executors that cannot open the store; Spark itself would
only say so after waiting for the master (about a minute when it is not there) with a Java stack trace.
"""

from __future__ import annotations

import importlib.util
import ipaddress
import os
import re
import shutil
import socket
import sys
import time
from collections.abc import Sequence
from typing import Any

from ignis.errors import InvalidInputError
from ignis_pipeline.stores import LMDB_LOCAL_ONLY

DEFAULT_MASTER = "local[*]"
JAVA_MISSING = ("Spark needs Java 17 or newer and no `java` was found on PATH (nor JAVA_HOME set): install one, "
                "e.g. apt-get install openjdk-17-jre-headless")
SPARK_MISSING = "the pipeline needs the spark extra: pip install 'ignismq[spark]' (and Java 17+)"
# How long the master may take to accept a TCP connection before a job gives up on it. Spark itself would
# retry for about a minute and then fail with "Cannot call methods on a stopped SparkContext".
MASTER_ANSWER_SECONDS = 5.0
STANDALONE_PORT = 7077


def parse_conf(pairs: Sequence[str] | None) -> dict[str, str]:
    conf: dict[str, str] = {}
    for pair in pairs or ():
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise InvalidInputError(f"--conf {pair!r}: expected KEY=VALUE (e.g. spark.executor.memory=4g)")
        conf[key.strip()] = value
    return conf


def under_spark_submit() -> bool:
    """True in a Python driver started by spark-submit (or a pyspark shell): its JVM is already running and
    handed this process its gateway port, and spark-submit's --master and --conf are in that JVM."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def _submitted_master() -> str | None:
    """spark.master as spark-submit set it, read from the running JVM without creating a SparkContext."""
    from pyspark import SparkConf, SparkContext

    SparkContext._ensure_initialized()  # attaches to spark-submit's JVM (the gateway port in the environment)
    return SparkConf().get("spark.master", None)


def effective_master(master: str | None = None, conf: dict[str, str] | None = None) -> str:
    """The master a session built with these arguments gets, known before it is built."""
    if master:
        return master
    if (conf or {}).get("spark.master"):
        return str((conf or {})["spark.master"])
    if "pyspark" not in sys.modules and not under_spark_submit():
        return DEFAULT_MASTER  # no session can be active in a process that has not imported pyspark
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        return DEFAULT_MASTER
    active = SparkSession.getActiveSession()
    if active is not None:
        return str(active.sparkContext.master)
    if under_spark_submit():
        return _submitted_master() or DEFAULT_MASTER
    return DEFAULT_MASTER


_MASTER_FORMS = re.compile(
    r"^(local|local\[(\*|[1-9]\d*)(,[1-9]\d*)?\]|local-cluster\[[1-9]\d*,\s*[1-9]\d*,\s*[1-9]\d*\]|yarn|"
    r"spark://[^,/\s]+:\d+(,[^,/\s]+:\d+)*|k8s://\S+)$")
MASTER_FORMS = "local, local[N], local[*], local[N,F], spark://HOST:PORT[,HOST:PORT...], yarn or k8s://URL"


def check_master_url(master: str, what: str = "--master") -> None:
    """Bad input, one line, unless `master` is a master URL Spark takes: found before Spark starts (Spark itself
    says so only once its JVM is up, with a Java stack trace)."""
    if not _MASTER_FORMS.match(master.strip()):
        raise InvalidInputError(f"{what} {master!r}: not a Spark master URL ({MASTER_FORMS})")


def master_addresses(master: str) -> list[tuple[str, int]]:
    """The host:port addresses a master URL connects to: each of a standalone master's (HA) list, or a
    Kubernetes API server; [] for masters without one (local, yarn)."""
    master = master.strip()
    if master.startswith("spark://"):
        found = []
        for address in master[len("spark://"):].split(","):
            host, sep, port = address.strip().rpartition(":")
            if sep and port.isdigit():
                found.append((host.strip("[]"), int(port)))
            elif address.strip():
                found.append((address.strip().strip("[]"), STANDALONE_PORT))
        return found
    if master.startswith("k8s://"):
        from urllib.parse import urlsplit

        rest = master[len("k8s://"):]
        parts = urlsplit(rest if "://" in rest else f"https://{rest}")
        try:
            port = parts.port
        except ValueError:
            return []
        if not parts.hostname:
            return []
        return [(parts.hostname, port or (80 if parts.scheme == "http" else 443))]
    return []


def check_master_answers(master: str, within: float = MASTER_ANSWER_SECONDS) -> None:
    """Bad input, one line, unless the master accepts a TCP connection (one address of an HA list is
    enough) within `within` seconds: checked before a session starts."""
    addresses = master_addresses(master)
    if not addresses:
        return
    deadline = time.monotonic() + within
    problems = []
    for host, port in addresses:
        left = deadline - time.monotonic()
        if left <= 0:
            problems.append(f"{host}:{port}: not tried, out of time")
            continue
        try:
            socket.create_connection((host, port), timeout=left).close()
            return
        except TimeoutError:
            problems.append(f"{host}:{port}: no answer within {within:.0f} s")
        except OSError as exc:
            problems.append(f"{host}:{port}: {exc.strerror or exc}")
    raise InvalidInputError(f"Spark master {master} does not answer ({'; '.join(problems)}): start it, or "
                            "give another --master")


def check_runtime() -> None:
    """Bad input, one line, unless pyspark is installed and a `java` can be found: checked before anything of
    Spark is imported or started."""
    if importlib.util.find_spec("pyspark") is None:
        raise InvalidInputError(SPARK_MISSING)
    if not os.environ.get("JAVA_HOME") and shutil.which("java") is None:
        raise InvalidInputError(JAVA_MISSING)


def build_session(app_name: str, master: str | None = None, conf: dict[str, str] | None = None, *,
                  log_level: str | None = None) -> Any:
    """A SparkSession with the `ignis` format registered. A master that does not answer is bad input, found
    before the session starts (check_master_answers). `log_level` (log4j's names, e.g. OFF): the level of
    Spark's logs from the JVM's start on, and a local master's driver on loopback, when this call starts the
    JVM (ignis_pipeline.spark_logs); None leaves Spark's logging as Spark configures it."""
    check_runtime()
    from pyspark.sql import SparkSession

    # Python workers run this interpreter (with ignis installed), not whatever `python3` is on PATH.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name)
    active = SparkSession.getActiveSession()
    if active is None:
        check_master_answers(effective_master(master, conf))
    if active is None and master is None and "spark.master" not in (conf or {}) and not under_spark_submit():
        master = DEFAULT_MASTER  # spark-submit sets spark.master itself: never override it
    if log_level is not None and active is None and not under_spark_submit():
        from ignis_pipeline import spark_logs

        chosen = effective_master(master, conf)
        conf = spark_logs.session_settings(chosen, conf or {}, log_level)
        spark_logs.start_jvm({**conf, "spark.master": chosen, "spark.app.name": app_name}, chosen, log_level)
    if master is not None:
        builder = builder.master(master)
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    if log_level is not None:
        spark.sparkContext.setLogLevel(log_level)
    import ignis_pipeline

    ignis_pipeline.register(spark)
    return spark


def check_store_reachable(spark: Any, store_url: str) -> None:
    """An lmdb store works with a master on this host only: say so before any task fails on another host."""
    check_master(str(spark.sparkContext.master), store_url)


def _loopback(host: str) -> bool:
    host = host.strip().strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may be any machine


def master_on_this_host(master: str) -> bool:
    """True for a master whose executors all run on this host: local[...] and local-cluster[...], or a
    standalone master reached on a loopback address (spark://127.0.0.1:7077, spark://localhost:7077; each of
    an HA list). A master reached on a loopback address runs here, and so do the workers it accepted on
    that address; a task that still lands on another host is refused by the task itself (stores.check_host)."""
    master = master.strip()
    if master == "local" or master.startswith(("local[", "local-cluster[")):
        return True
    if not master.startswith("spark://"):
        return False  # yarn, k8s://..., mesos://...: executors anywhere
    hosts = []
    for address in master[len("spark://"):].split(","):
        host, sep, port = address.rpartition(":")
        hosts.append(host if sep and port.isdigit() else address)
    return bool(hosts) and all(_loopback(h) for h in hosts)


def check_master(master: str, store_url: str) -> None:
    """Refuse (bad input, before any session starts) an lmdb store with a master whose executors may run on
    other hosts."""
    if store_url.startswith("lmdb:") and not master_on_this_host(master):
        raise InvalidInputError(f"store {store_url} with master {master}: {LMDB_LOCAL_ONLY}")

"""What Spark prints under an `ignis pipeline` command: only what the command asks for (ignis_pipeline.settings:
IGNIS_SPARK_LOG_LEVEL, `--verbose`), and a local master on loopback without being told.

Spark's driver JVM prints before any Python code could call `sc.setLogLevel`: log4j's start-up line, the WARNs
of its first seconds (a host name that resolves to a loopback address, no native Hadoop library), the shell's
"Setting default log level" lines, and the JVM's own "Using incubator modules" warning. So the level is set
when the JVM starts: a log4j2 configuration of ours (log4j2.properties beside this module, every logger at the
level of the system property ignis.spark.logLevel), given by `spark.driver.extraJavaOptions`; and at OFF (the
default) the JVM's own stdout and stderr go to a file that is removed at exit, read only to say why a JVM did
not start. A local master's driver binds to 127.0.0.1 (`spark.driver.host`, `spark.driver.bindAddress`,
SPARK_LOCAL_IP), so Spark never goes looking for another address. Settings the caller gives itself win.

Only when this process starts the JVM: under spark-submit (or with a JVM already running) the level is set with
`setLogLevel` once the session is there, and the rest is spark-submit's.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import tempfile
from collections.abc import Mapping
from pathlib import Path

from ignis.errors import IgnisError
from ignis_pipeline.settings import QUIET

LOG4J2_FILE = Path(__file__).with_name("log4j2.properties")
LEVEL_PROPERTY = "ignis.spark.logLevel"
LOOPBACK = "127.0.0.1"
_LOCAL = re.compile(r"^local(\[.*\])?$|^local-cluster\[.*\]$")


def is_local(master: str) -> bool:
    """local, local[...] and local-cluster[...]: every executor in this host's JVMs."""
    return bool(_LOCAL.match(master.strip()))


def session_settings(master: str, conf: Mapping[str, str], level: str) -> dict[str, str]:
    """`conf` with what a command's session adds: the log4j2 configuration and level on the driver's JVM options
    (after the caller's own; a configuration file the caller names is kept), and for a local master the driver
    on loopback (unless the caller set its addresses)."""
    out = dict(conf)
    own = out.get("spark.driver.extraJavaOptions", "").strip()
    ours = f"-D{LEVEL_PROPERTY}={level}"
    if "log4j2.configurationFile" not in own and "log4j.configurationFile" not in own:
        ours = f"-Dlog4j2.configurationFile={LOG4J2_FILE.as_uri()} {ours}"
    out["spark.driver.extraJavaOptions"] = f"{ours} {own}".strip()
    if is_local(master):
        out.setdefault("spark.driver.host", LOOPBACK)
        out.setdefault("spark.driver.bindAddress", LOOPBACK)
    return out


def start_jvm(conf: Mapping[str, str], master: str, level: str) -> None:
    """Start this process's Spark JVM (pyspark's launch_gateway, as a SparkSession would) with `conf` (every
    setting of the session to be, master and app name included): at level OFF its output goes to a file, so
    nothing of Spark reaches the terminal. A JVM that does not start is an error naming its last line."""
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    if SparkContext._gateway is not None:
        return  # a JVM runs already (an earlier session of this process): its logging is what it is
    if is_local(master):
        os.environ.setdefault("SPARK_LOCAL_IP", LOOPBACK)  # read by the JVM before any setting
    spark_conf = SparkConf()  # (no JVM yet: a plain dict of settings, passed to spark-submit as --conf)
    spark_conf.setAll(list(conf.items()))
    if level != QUIET:
        SparkContext._ensure_initialized(gateway=launch_gateway(spark_conf))
        return
    fd, path = tempfile.mkstemp(prefix="ignis-spark-", suffix=".log")
    atexit.register(_remove, path)
    try:
        with os.fdopen(fd, "wb") as log:  # (the JVM keeps its own descriptors of it)
            gateway = launch_gateway(spark_conf, popen_kwargs={"stdout": log, "stderr": log})
    except Exception as exc:
        raise IgnisError(f"Spark did not start: {_last_line(path) or exc} (IGNIS_SPARK_LOG_LEVEL=INFO or "
                         "--verbose shows its log)") from None
    SparkContext._ensure_initialized(gateway=gateway)


def _last_line(path: str) -> str:
    with contextlib.suppress(OSError):
        lines = [line.strip() for line in Path(path).read_text(errors="replace").splitlines() if line.strip()]
        return lines[-1] if lines else ""
    return ""


def _remove(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)

"""The SparkSession of a job: `local[*]` by default, `--master URL` and `--conf k=v` passed through.

Under `spark-submit` the session already exists (master and conf come from spark-submit) and is reused.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Sequence
from typing import Any

from ignis.errors import InvalidInputError, StoreUnavailable
from ignis_pipeline.stores import LMDB_LOCAL_ONLY

DEFAULT_MASTER = "local[*]"
JAVA_MISSING = ("Spark needs Java 17 or newer and no `java` was found on PATH (nor JAVA_HOME set): install one, "
                "e.g. apt-get install openjdk-17-jre-headless")
SPARK_MISSING = "the pipeline needs the spark extra: pip install 'ignismq[spark]' (and Java 17+)"


def parse_conf(pairs: Sequence[str] | None) -> dict[str, str]:
    conf: dict[str, str] = {}
    for pair in pairs or ():
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise InvalidInputError(f"--conf {pair!r}: expected KEY=VALUE (e.g. spark.executor.memory=4g)")
        conf[key.strip()] = value
    return conf


def build_session(app_name: str, master: str | None = None, conf: dict[str, str] | None = None) -> Any:
    """A SparkSession with the `ignis` format registered."""
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        raise InvalidInputError(SPARK_MISSING) from None
    if not os.environ.get("JAVA_HOME") and shutil.which("java") is None:
        raise InvalidInputError(JAVA_MISSING)
    # Python workers run this interpreter (with ignis installed), not whatever `python3` is on PATH.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name)
    active = SparkSession.getActiveSession()
    if active is None and master is None and "spark.master" not in (conf or {}):
        master = DEFAULT_MASTER  # not under spark-submit, which sets spark.master itself
    if master is not None:
        builder = builder.master(master)
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    import ignis_pipeline

    ignis_pipeline.register(spark)
    return spark


def check_store_reachable(spark: Any, store_url: str) -> None:
    """An lmdb store works with a local master only: say so before any task fails on another host."""
    check_master(str(spark.sparkContext.master), store_url)


def check_master(master: str, store_url: str) -> None:
    if store_url.startswith("lmdb:") and not master.startswith("local"):
        raise StoreUnavailable(f"store {store_url} with master {master}: {LMDB_LOCAL_ONLY}")

"""Fixtures of the pipeline tests: a real local SparkSession (local[2], two shuffle partitions), a real Spark
standalone cluster on loopback for the `spark_cluster` tests, and a store per test that Spark's Python
workers can open themselves: lmdb always, a real Aerospike server when IGNIS_TEST_AEROSPIKE is set (the
in-memory emulator lives in the test process, which Spark's workers are not).

One Python process holds one SparkContext at a time: the cluster tests' session replaces the local one
for their module, and the local one is made again when a later test asks for it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.aerospike_support import lmdb_or_real_server_url

from ignis import Ignis, QueueSpec

pytest.importorskip("pyspark", reason="the pipeline tests need the spark extra")

LOCAL_CONF = {
    "spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2", "spark.ui.enabled": "false",
    "spark.driver.memory": "1g", "spark.sql.session.timeZone": "UTC", "spark.python.worker.reuse": "true",
}


def _stop_active_session() -> None:
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        active.stop()


def _running(session: Any) -> bool:
    return session is not None and session.sparkContext._jsc is not None


@pytest.fixture(scope="session")
def _local_spark() -> Iterator[dict[str, Any]]:
    holder: dict[str, Any] = {"session": None}
    yield holder
    if _running(holder["session"]):
        holder["session"].stop()


@pytest.fixture
def spark(_local_spark: dict[str, Any]) -> Any:
    """The local session (local[2]), made on first use and again after a cluster module stopped it."""
    session = _local_spark["session"]
    if not _running(session):
        from ignis_pipeline.session import build_session

        _stop_active_session()
        session = build_session("ignis-tests", "local[2]", LOCAL_CONF)
        session.sparkContext.setLogLevel("ERROR")
        _local_spark["session"] = session
    return session


@pytest.fixture(scope="module")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A standalone master and two workers on 127.0.0.1 (tests/support/spark_cluster.py), for one module."""
    from support.spark_cluster import standalone_cluster

    with standalone_cluster(tmp_path_factory.mktemp("spark-cluster"), workers=2) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def cluster_spark(spark_cluster: Any) -> Iterator[Any]:
    """A SparkSession on the standalone cluster: two executors, one per worker, each its own JVM with its own
    Python workers."""
    from ignis_pipeline.session import build_session
    from support.spark_cluster import wait_for_executors

    _stop_active_session()
    session = build_session("ignis-cluster-tests", spark_cluster.master_url, {
        **spark_cluster.session_conf(), "spark.driver.memory": "1g", "spark.sql.session.timeZone": "UTC"})
    session.sparkContext.setLogLevel("ERROR")
    try:
        wait_for_executors(session, 2)
        yield session
    finally:
        session.stop()


@pytest.fixture(params=["lmdb", "aerospike"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    yield from lmdb_or_real_server_url(request.param, tmp_path)


@pytest.fixture
def ignis(store_url: str) -> Iterator[Ignis]:
    client = Ignis(store_url, purge_interval=0)
    yield client
    client.close()


@pytest.fixture
def make_queue(ignis: Ignis) -> Any:
    def make(name: str = "orders", **fields: Any) -> Any:
        fields.setdefault("handlerType", name)
        fields.setdefault("shards", 4)
        ignis.apply(QueueSpec.build(name=name, **fields))
        return ignis.queue(name)

    return make


@pytest.fixture
def read(spark: Any, store_url: str) -> Any:
    """spark.read.format('ignis') on this test's store."""

    def reader(**options: Any) -> Any:
        r = spark.read.format("ignis").option("store", store_url)
        for key, value in options.items():
            r = r.option(key, str(value))
        return r.load()

    return reader

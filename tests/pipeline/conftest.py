"""Fixtures of the pipeline tests: one real local SparkSession for the whole run (local[2], two shuffle
partitions), and a store per test that Spark's Python workers can open themselves: lmdb always, a real
Aerospike server when IGNIS_TEST_AEROSPIKE is set (the in-memory emulator lives in the test process,
which Spark's workers are not)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.aerospike_support import lmdb_or_real_server_url

from ignis import Ignis, QueueSpec

pytest.importorskip("pyspark", reason="the pipeline tests need the spark extra")


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    from ignis_pipeline.session import build_session

    session = build_session("ignis-tests", "local[2]", {
        "spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2", "spark.ui.enabled": "false",
        "spark.driver.memory": "1g", "spark.sql.session.timeZone": "UTC",
        "spark.python.worker.reuse": "true",
    })
    session.sparkContext.setLogLevel("ERROR")
    yield session
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

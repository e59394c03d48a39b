"""Fixtures of the sweeper tests."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from sweeper_helpers import Clock

from ignis import Ignis, QueueSpec
from ignis.queue import Queue
from ignis.storage.base import Storage


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def declare(store: Storage) -> Callable[..., Queue]:
    """Declare a queue on the `store` fixture (1 shard, 300 s sweepDuration unless told) and return it."""
    client = Ignis(store)

    def make(name: str = "orders", **fields: Any) -> Queue:
        fields.setdefault("handlerType", name)
        fields.setdefault("shards", 1)
        fields.setdefault("sweepDurationSeconds", 300)
        client.apply(QueueSpec.build(name=name, **fields))
        return client.refresh(name)

    return make

"""Test seams that stop a store operation at an exact point, for tests of races: a publish paused
between its slot allocation and its record write, on either backend, without hooks in the library.

lmdb: a publish is one transaction, so the pause holds it open (and with it the write lock) right
before its data record is put; a concurrent claim then waits for the transaction, as it would in life.
Aerospike: the pause holds the data record's write after the load pointer's increment has answered.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ignis import names
from ignis.storage.base import Storage


class Gate:
    """`reached` is set when the paused call arrives; it waits for `release` (at most `timeout` s)."""

    def __init__(self, timeout: float = 30.0) -> None:
        self.reached = threading.Event()
        self.release = threading.Event()
        self.timeout = timeout
        self.used = False

    def pause_once(self) -> None:
        if self.used:
            return
        self.used = True
        self.reached.set()
        self.release.wait(self.timeout)


class _Proxy:
    """Everything delegated to `inner` but what a subclass defines."""

    def __init__(self, inner: Any, gate: Gate) -> None:
        self._inner = inner
        self._gate = gate

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _PausingAerospikeClient(_Proxy):
    def __init__(self, inner: Any, gate: Gate, data_set: str) -> None:
        super().__init__(inner, gate)
        self._data_set = data_set

    def put(self, key: tuple, *args: Any, **kwargs: Any) -> Any:
        if key[1] == self._data_set:
            self._gate.pause_once()
        return self._inner.put(key, *args, **kwargs)

    def batch_write(self, batch: Any, *args: Any, **kwargs: Any) -> Any:
        first = batch.batch_records[0].key if batch.batch_records else None
        if first is not None and first[1] == self._data_set and any(
                op.get("bin") == "payload" for op in batch.batch_records[0].ops):
            self._gate.pause_once()
        return self._inner.batch_write(batch, *args, **kwargs)


class _PausingTxn(_Proxy):
    def __init__(self, inner: Any, gate: Gate, data_db: Any) -> None:
        super().__init__(inner, gate)
        self._data_db = data_db

    def __enter__(self) -> _PausingTxn:
        self._inner.__enter__()
        return self

    def __exit__(self, *exc: Any) -> Any:
        return self._inner.__exit__(*exc)

    def put(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("db", args[5] if len(args) > 5 else None) is self._data_db:
            self._gate.pause_once()
        return self._inner.put(*args, **kwargs)

    def cursor(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("db", args[0] if args else None) is self._data_db:
            self._gate.pause_once()  # publish_many writes through a cursor's putmulti
        return self._inner.cursor(*args, **kwargs)


class _PausingEnv(_Proxy):
    def __init__(self, inner: Any, gate: Gate, data_db: Any) -> None:
        super().__init__(inner, gate)
        self._data_db = data_db

    def begin(self, *args: Any, **kwargs: Any) -> Any:
        txn = self._inner.begin(*args, **kwargs)
        write = kwargs.get("write", args[2] if len(args) > 2 else False)
        return _PausingTxn(txn, self._gate, self._data_db) if write and not self._gate.used else txn


@contextmanager
def paused_publish_write(store: Storage, timeout: float = 30.0) -> Iterator[Gate]:
    """Pause the next message-record write of `store` until `gate.release` is set."""
    gate = Gate(timeout)
    from ignis.storage.aerospike import AerospikeStore
    from ignis.storage.lmdb import LmdbStore

    if isinstance(store, AerospikeStore):
        real = store._ctx.client
        store._ctx.client = _PausingAerospikeClient(real, gate, names.data_set(store.client_id))
        try:
            yield gate
        finally:
            gate.release.set()
            store._ctx.client = real
    elif isinstance(store, LmdbStore):
        environment = store._ctx.env
        real = environment.env
        environment.env = _PausingEnv(real, gate, store._ctx.data)
        try:
            yield gate
        finally:
            gate.release.set()
            environment.env = real
    else:
        raise TypeError(f"no publish pause for {type(store).__name__}")

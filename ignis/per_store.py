"""One background helper per store handle (the watcher, the delay mover): made on first use, again once it
stopped, dropped with the handle (weak keys), and never again once the handle is being closed (`retire`)."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

from ignis.storage.base import Storage


class _Helper(Protocol):
    stopped: bool
    _thread: threading.Thread

    def stop(self) -> None: ...


T = TypeVar("T", bound=_Helper)


class PerStore(Generic[T]):
    def __init__(self, make: Callable[[Storage], T]) -> None:
        self._make = make
        self._made: weakref.WeakKeyDictionary[Storage, T] = weakref.WeakKeyDictionary()
        self._retired: weakref.WeakSet[Storage] = weakref.WeakSet()
        self._lock = threading.Lock()

    def get(self, store: Storage) -> T | None:
        """The store handle's helper, started if it has none running; None once the handle is retired."""
        found = self._made.get(store)
        if found is None or found.stopped:
            with self._lock:
                if store in self._retired:
                    return None
                found = self._made.get(store)
                if found is None or found.stopped:
                    found = self._made[store] = self._make(store)
        return found

    def find(self, store: Storage) -> T | None:
        """The store handle's helper if one was made (running or not)."""
        return self._made.get(store)

    def retire(self, store: Storage, timeout: float = 5.0) -> None:
        """Stop the handle's helper for good and wait for it: called before the handle closes, since a store call
        must not be running when its environment or connection goes (the Aerospike client's close frees what a
        call in flight still uses). A thread that wants a helper afterwards (a late fire()) gets none."""
        with self._lock:
            self._retired.add(store)
            found = self._made.get(store)
        if found is not None:
            found.stop()
            if found._thread is not threading.current_thread():
                found._thread.join(timeout)

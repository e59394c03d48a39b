"""One background helper per store handle (the watcher, the delay mover): made on first use, again once it
stopped, and dropped with the handle (weak keys)."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

from ignis.storage.base import Storage


class _Stoppable(Protocol):
    stopped: bool


T = TypeVar("T", bound=_Stoppable)


class PerStore(Generic[T]):
    def __init__(self, make: Callable[[Storage], T]) -> None:
        self._make = make
        self._made: weakref.WeakKeyDictionary[Storage, T] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def get(self, store: Storage) -> T:
        """The store handle's helper, started if it has none running."""
        found = self._made.get(store)
        if found is None or found.stopped:
            with self._lock:
                found = self._made.get(store)
                if found is None or found.stopped:
                    found = self._made[store] = self._make(store)
        return found

    def find(self, store: Storage) -> T | None:
        """The store handle's helper if one was made (running or not)."""
        return self._made.get(store)

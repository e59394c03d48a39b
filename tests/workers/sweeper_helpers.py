"""Helpers for the sweeper tests: a settable clock and a fault-injecting store wrapper."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from ignis.envelope import now_ms
from ignis.storage.base import Storage


class Clock:
    """Epoch ms that a test moves by hand."""

    def __init__(self, start: int | None = None) -> None:
        self.now = now_ms() if start is None else start

    def __call__(self) -> int:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += int(seconds * 1000)


class Crash(RuntimeError):
    """The injected fault."""


class FaultStore:
    """Delegates to a real store, and raises Crash at chosen calls: `fail["delete"] = 1` fails the next
    delete once; `when["peek"] = predicate(args)` fails every peek the predicate picks."""

    def __init__(self, inner: Storage) -> None:
        self._inner = inner
        self.fail: dict[str, int] = {}
        self.when: dict[str, Callable[..., bool]] = {}
        self.calls: dict[str, int] = {}

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._inner, name)
        if not callable(target):
            return target

        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] = self.calls.get(name, 0) + 1
            if self.fail.get(name, 0) > 0:
                self.fail[name] -= 1
                raise Crash(f"injected failure of {name}")
            if name in self.when and self.when[name](*args, **kwargs):
                raise Crash(f"injected failure of {name}{args}")
            return target(*args, **kwargs)

        return call

    def with_client(self, client_id: str) -> Storage:
        return self if client_id == self._inner.client_id else self._inner.with_client(client_id)




class PausingStore(FaultStore):
    """A FaultStore that also stops the first call of `method` until `release` is set (`reached` tells
    when it arrived), and keeps every call's outcome: `outcomes[method]` = results or exceptions."""

    def __init__(self, inner: Storage, method: str, timeout: float = 30.0) -> None:
        super().__init__(inner)
        self.method = method
        self.reached = threading.Event()
        self.release = threading.Event()
        self.timeout = timeout
        self.outcomes: dict[str, list[Any]] = {}

    def __getattr__(self, name: str) -> Any:
        call = super().__getattr__(name)
        if not callable(call):
            return call

        def paused(*args: Any, **kwargs: Any) -> Any:
            if name == self.method and not self.reached.is_set():
                self.reached.set()
                self.release.wait(self.timeout)
            try:
                result = call(*args, **kwargs)
            except Exception as exc:
                self.outcomes.setdefault(name, []).append(exc)
                raise
            self.outcomes.setdefault(name, []).append(result)
            return result

        return paused

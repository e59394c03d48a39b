"""The lmdb store's doorbell: a publisher wakes the consumer processes of a magazine right after its commit
(ignis.watch), so a message published by one process reaches a waiting consumer in another within a
fraction of a millisecond, with no polling.

Every process that has consumers waiting on magazines of an environment listens on a Unix datagram socket
in the environment's directory, `wake/<id>.sock`, and lists the magazines it listens for in `wake/<id>.subs`
("clientId/magazine" lines, replaced atomically). A publisher reads the listing (again whenever the
directory changed, looked at most every LISTING_TTL_SECONDS) and sends each listener of the magazine one
datagram, "clientId/magazine NUL shard,shard,...", without blocking: a full socket buffer means its
listener has rings to read anyway, and a refused one means its process is gone (its files are removed).
The listener marks the shards active (ignis.activity) and so wakes the consumers waiting on them.

A ring is a hint, never the only way a message is found: the watcher also reads the pointers now and then
(ignis.watch.DOORBELL_POLL_SECONDS), so a lost datagram delays a message, never strands it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Collection, Iterable

from ignis.activity import activity_for

log = logging.getLogger(__name__)

LISTING_TTL_SECONDS = 0.05
SUN_PATH_MAX = 100  # sockaddr_un's path holds 108 bytes; longer paths go through /proc/self/fd/N/
RECEIVE_BUFFER = 1 << 20
RECEIVE_TIMEOUT_SECONDS = 0.5


class EnvironmentBell:
    """The doorbell of one lmdb environment in this process: rings other processes' listeners, and listens
    for the magazines this process's consumers wait on. Thread-safe."""

    def __init__(self, path: str, location: str) -> None:
        self.location = location  # what the activity registry knows the environment by (Storage.location)
        self.dir = os.path.join(path, "wake")
        os.makedirs(self.dir, exist_ok=True)
        self._dir_fd = os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY)
        self.id = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._lock = threading.Lock()
        self._subscriptions: dict[str, frozenset[str]] = {}  # client -> its magazines
        self._listening: frozenset[str] = frozenset()  # "client/magazine" keys in our .subs file
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._closed = False
        # Publisher side: "client/magazine" -> connected sockets of its listeners; re-read on change.
        self._targets: dict[str, list[tuple[str, socket.socket]]] = {}
        self._connections: dict[str, socket.socket] = {}
        self._listed_at = float("-inf")
        self._listed_mtime = -1

    def _address(self, name: str) -> str:
        full = os.path.join(self.dir, name)
        return full if len(full) <= SUN_PATH_MAX else f"/proc/self/fd/{self._dir_fd}/{name}"

    # ---- publisher side ---------------------------------------------------------------------------------
    def ring(self, client: str, magazine: str, shards: Iterable[int]) -> None:
        """Tell the listeners of client/magazine that these shards got messages (best effort, never blocks)."""
        now = time.monotonic()
        if now - self._listed_at >= LISTING_TTL_SECONDS:
            self._relist(now)
        key = f"{client}/{magazine}"
        targets = self._targets.get(key)
        if not targets:
            return
        message = f"{key}\0{','.join(map(str, shards))}".encode()
        for listener, sock in targets:
            try:
                sock.send(message, socket.MSG_DONTWAIT)
            except BlockingIOError:  # its buffer is full: it has rings to read already
                continue
            except OSError:  # its process is gone
                self._forget(listener)

    def _relist(self, now: float) -> None:
        with self._lock:
            if now - self._listed_at < LISTING_TTL_SECONDS:
                return
            self._listed_at = now
            try:
                mtime = os.stat(self.dir).st_mtime_ns
            except OSError:
                return
            if mtime == self._listed_mtime:
                return
            self._listed_mtime = mtime
            targets: dict[str, list[tuple[str, socket.socket]]] = {}
            try:
                names = os.listdir(self.dir)
            except OSError:
                return
            for name in names:
                if not name.endswith(".subs") or name.startswith(self.id):
                    continue
                listener = name[:-5]
                try:
                    with open(os.path.join(self.dir, name)) as f:
                        keys = f.read().split()
                except OSError:
                    continue
                sock = self._connections.get(listener) or self._connect(listener)
                if sock is None:
                    continue
                for key in keys:
                    targets.setdefault(key, []).append((listener, sock))
            for listener in set(self._connections) - {lst for ts in targets.values() for lst, _ in ts}:
                self._connections.pop(listener).close()
            self._targets = targets

    def _connect(self, listener: str) -> socket.socket | None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            sock.connect(self._address(f"{listener}.sock"))
        except OSError:  # not listening (yet, or any more)
            sock.close()
            if not os.path.exists(os.path.join(self.dir, f"{listener}.sock")):
                return None
            self._remove_files(listener)  # a socket nobody listens on: its process is gone
            return None
        self._connections[listener] = sock
        return sock

    def _forget(self, listener: str) -> None:
        with self._lock:
            sock = self._connections.pop(listener, None)
            if sock is not None:
                sock.close()
            self._targets = {k: [t for t in ts if t[0] != listener] for k, ts in self._targets.items()}
        self._remove_files(listener)

    def _remove_files(self, listener: str) -> None:
        for suffix in (".subs", ".sock"):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(self.dir, listener + suffix))

    # ---- listener side ------------------------------------------------------------------------------------
    def subscribe(self, client: str, magazines: Collection[str]) -> None:
        """Listen for rings of these magazines of `client` (replacing its earlier set; empty: none)."""
        with self._lock:
            if self._closed:
                return
            self._subscriptions[client] = frozenset(magazines)
            keys = frozenset(f"{c}/{m}" for c, ms in self._subscriptions.items() for m in ms)
            if keys == self._listening:
                return
            if keys and self._sock is None:
                self._listen()
            self._listening = keys
            subs = os.path.join(self.dir, f"{self.id}.subs")
            if keys:
                temporary = f"{subs}.tmp"
                with open(temporary, "w") as f:
                    f.write("\n".join(sorted(keys)) + "\n")
                os.replace(temporary, subs)  # a publisher reads the old list or the new one, never half
            else:
                with contextlib.suppress(OSError):
                    os.unlink(subs)

    def _listen(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)
        sock.bind(self._address(f"{self.id}.sock"))
        self._sock = sock
        self._thread = threading.Thread(target=self._receive, args=(sock,), name="ignis-doorbell", daemon=True)
        self._thread.start()

    def _receive(self, sock: socket.socket) -> None:
        sock.settimeout(RECEIVE_TIMEOUT_SECONDS)  # to see a close (a blocked recv is not woken by one)
        while self._sock is sock:
            try:
                data = sock.recv(4096)
            except TimeoutError:
                continue
            except OSError:  # closed
                return
            try:
                key, _, shards = data.decode().partition("\0")
                client, _, magazine = key.partition("/")
                activity_for(self.location, client, magazine).mark([int(s) for s in shards.split(",") if s])
            except ValueError:
                continue  # not a ring of ours

    def close(self) -> None:
        with self._lock:
            self._closed = True
            sock, self._sock = self._sock, None
            for conn in self._connections.values():
                conn.close()
            self._connections.clear()
            self._targets = {}
        if sock is not None:
            self._remove_files(self.id)
            sock.close()
        with contextlib.suppress(OSError):
            os.close(self._dir_fd)


class LmdbDoorbell:
    """A store view's side of its environment's bell (`Storage.doorbell`): one clientId's magazines."""

    def __init__(self, bell: EnvironmentBell, client_id: str) -> None:
        self._bell = bell
        self._client = client_id

    def subscribe(self, magazines: Collection[str]) -> None:
        self._bell.subscribe(self._client, magazines)

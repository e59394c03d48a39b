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

A publish rings while it still holds the write lock, before its commit flushes ("committing": the
datagram ends in "NUL committing"), so the listener's consumers wake while the flush runs instead of after
it; the consumers waiting in the publisher's own process are woken the same way, without a datagram. Such a
ring promises a commit that no reader can see yet, so the listener notes it, and the next claim of that
shard (ignis.storage.lmdb.claims) takes the write lock even when a look without it finds the shard drained:
the lock is free once the publisher's commit is done, and the claim then sees the message. A listener that
understands committing rings says so with a "+committing" line in its listing; one that does not (an older
version) is rung after the commit instead, as are the topics a listener lists with a leading "=": a subscription's
cursor claims in its own environment (ignis.storage.lmdb.cursor_environments), reading the topic without the
store's write lock, so it wakes once the publish's commit is there to read.

A ring is a hint, never the only way a message is found: the watcher also reads the pointers now and then
(ignis.watch.SAFETY_POLL_SECONDS), so a lost datagram delays a message, never strands it. A ring the listener's
socket refuses is not lost, though: Linux queues at most `net.unix.max_dgram_qlen` datagrams (10 by default) on a
Unix datagram socket whatever its buffer (unix(7)), and a listener busy for a moment (a consumer process on a loaded
machine) fills that with rings of other shards. What its queue refused is owed to it and sent again a moment later
(RETRY_SECONDS; merged per magazine, committing or not as it was), until sent or RETRY_FOR_SECONDS went by; dropped,
the last messages of a burst waited for the safety poll (measured: 17-24 s, at 1,000 msg/s to 3 subscriptions).
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

from ignis import names
from ignis.activity import activity_for

log = logging.getLogger(__name__)

LISTING_TTL_SECONDS = 0.05
SUN_PATH_MAX = 100  # sockaddr_un's path holds 108 bytes; longer paths go through /proc/self/fd/N/
RECEIVE_BUFFER = 1 << 20
RECEIVE_TIMEOUT_SECONDS = 0.5
COMMITTING = "committing"  # the flag of a ring sent before the commit, and the listing line of those who take it
AFTER_COMMIT = "="  # a listing line's mark: ring this magazine after the commit (to any listener)
RETRY_SECONDS = 0.001  # how soon a ring a listener's full queue refused is sent again
RETRY_FOR_SECONDS = 5.0  # ... and for how long (a listener stuck that long is left to the safety poll)


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
        # Publisher side: "client/magazine" -> its listeners' connected sockets, and whether each takes
        # committing rings; re-read on change.
        self._targets: dict[str, list[tuple[str, socket.socket, bool]]] = {}
        self._connections: dict[str, socket.socket] = {}
        self._listed_at = float("-inf")
        # Until then (monotonic) no other process listens, as far as the listing tells: a publish need not ring
        # (checked by the caller, without a call: a publish's hot path).
        self.quiet_until = float("-inf")
        self._listed_mtime = -1
        # Rings a listener's full queue refused, to send again: listener -> (client/magazine, committing) -> shards;
        # and since when each listener is owed one. Sent by the retry thread (started on the first refusal).
        self._owed: dict[str, dict[tuple[str, bool], set[int]]] = {}
        self._owed_since: dict[str, float] = {}
        self._owed_wake = threading.Condition(self._lock)
        self._retrier: threading.Thread | None = None
        # Listener side: the (client, magazine, shard)s that a committing ring vouched for, no claim asked since.
        # Never dropped by age: the claim that asks takes the write lock, so it sees a commit however slow
        # (one that was aborted costs that claim the lock, once).
        self._committing: set[tuple[str, str, int]] = set()

    def _address(self, name: str) -> str:
        full = os.path.join(self.dir, name)
        return full if len(full) <= SUN_PATH_MAX else f"/proc/self/fd/{self._dir_fd}/{name}"

    # ---- publisher side ---------------------------------------------------------------------------------
    def ring(self, client: str, magazine: str, shards: Iterable[int], after_committing: bool = False,
             committing: bool = False) -> None:
        """Tell the listeners of client/magazine that these shards got messages (best effort, never blocks).
        `after_committing`: a committing ring went before, so only the listeners that did not take it.
        `committing` (ring_committing's): a ring before the commit, only to the listeners that take it."""
        now = time.monotonic()
        if now - self._listed_at >= LISTING_TTL_SECONDS:
            self._relist(now)
        if not self._targets:  # no other process listens (a lone process's every publish): none till the next look
            self.quiet_until = self._listed_at + LISTING_TTL_SECONDS
            return
        key = f"{client}/{magazine}"
        targets = self._targets.get(key)
        if not targets:
            return
        shards = tuple(shards)  # (twice, if a listener's queue refuses it)
        message = _ring_message(key, shards, committing)
        for listener, sock, aware in targets:
            if (committing and not aware) or (after_committing and aware):
                continue
            try:
                sock.send(message, socket.MSG_DONTWAIT)
            except BlockingIOError:  # its queue is full: owed, sent again in a moment (see the module docstring)
                self._owe(listener, key, shards, committing)
            except OSError:  # its process is gone
                self._forget(listener)

    def _owe(self, listener: str, key: str, shards: Iterable[int], committing: bool) -> None:
        """A ring the listener's full queue refused: for the retry thread to send again."""
        with self._lock:
            if self._closed:
                return
            self._owed.setdefault(listener, {}).setdefault((key, committing), set()).update(shards)
            self._owed_since.setdefault(listener, time.monotonic())
            if self._retrier is None:
                self._retrier = threading.Thread(target=self._retry_loop, name="ignis-doorbell-retry", daemon=True)
                self._retrier.start()
            self._owed_wake.notify()

    def _retry_loop(self) -> None:
        """Send the owed rings again, RETRY_SECONDS after they were refused, until each is sent or its listener was
        owed one for RETRY_FOR_SECONDS (it then gets them from the safety poll)."""
        while True:
            with self._lock:
                while not self._owed and not self._closed:
                    self._owed_wake.wait()
                if self._closed:
                    return
                owed, self._owed = self._owed, {}
            time.sleep(RETRY_SECONDS)
            for listener, rings in owed.items():
                sock = self._connections.get(listener)
                for (key, committing), shards in rings.items():
                    if sock is None:  # forgotten meanwhile: its process is gone
                        break
                    try:
                        sock.send(_ring_message(key, shards, committing), socket.MSG_DONTWAIT)
                    except BlockingIOError:
                        if time.monotonic() - self._owed_since.get(listener, 0.0) < RETRY_FOR_SECONDS:
                            self._owe(listener, key, shards, committing)
                        else:
                            log.debug("doorbell: listener %s refused rings for %.0f s; the safety poll finds their "
                                      "messages", listener, RETRY_FOR_SECONDS)
                    except OSError:
                        self._forget(listener)
                        sock = None
                with self._lock:
                    if listener not in self._owed:
                        self._owed_since.pop(listener, None)

    def ring_committing(self, client: str, magazine: str, shards: Iterable[int]) -> bool:
        """Like ring, from inside a write transaction before its commit: to the listeners that take it, and to
        this process's consumers that wait on the magazine (their own mark comes after the flush). True if
        one of those was woken."""
        shards = tuple(shards)
        activity = activity_for(self.location, client, magazine)
        woke = activity.waiting > 0
        if woke:
            self._committing.update((client, magazine, shard) for shard in shards)
            activity.mark(shards)
        self.ring(client, magazine, shards, committing=True)
        return woke

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
            targets: dict[str, list[tuple[str, socket.socket, bool]]] = {}
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
                aware = f"+{COMMITTING}" in keys
                for key in keys:
                    if key.startswith(AFTER_COMMIT):  # a topic its subscriptions' cursors read: rung after the commit
                        targets.setdefault(key[1:], []).append((listener, sock, False))
                    elif not key.startswith("+"):
                        targets.setdefault(key, []).append((listener, sock, aware))
            for listener in set(self._connections) - {t[0] for ts in targets.values() for t in ts}:
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
            keys = frozenset(f"{AFTER_COMMIT}{c}/{m[1:]}" if m.startswith(AFTER_COMMIT) else f"{c}/{m}"
                             for c, ms in self._subscriptions.items() for m in ms)
            if keys == self._listening:
                return
            if keys and self._sock is None:
                self._listen()
            self._listening = keys
            subs = os.path.join(self.dir, f"{self.id}.subs")
            if keys:
                temporary = f"{subs}.tmp"
                with open(temporary, "w") as f:
                    f.write("\n".join([f"+{COMMITTING}", *sorted(keys)]) + "\n")
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
                key, _, rest = data.decode().partition("\0")
                shards, _, flag = rest.partition("\0")
                client, _, magazine = key.partition("/")
                marked = [int(s) for s in shards.split(",") if s]
            except ValueError:
                continue  # not a ring of ours
            if flag == COMMITTING:  # noted before the mark wakes a claimer, who looks for the note
                self._committing.update((client, magazine, shard) for shard in marked)
            # (committing: the shards stay listed through reads of the pointers made before that commit)
            activity_for(self.location, client, magazine).mark(marked, committing=flag == COMMITTING)

    def take_committing(self, client: str, magazine: str, shard: int) -> bool:
        """Whether a committing ring vouches for a commit to that shard that a reader may not see yet (and
        forget it: the claim that asks takes the write lock, so it sees the commit)."""
        try:
            self._committing.remove((client, magazine, shard))  # (atomic: several claimers may ask at once)
        except KeyError:
            return False
        return True

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._owed_wake.notify_all()
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


def _ring_message(key: str, shards: Iterable[int], committing: bool) -> bytes:
    """A ring's datagram: "clientId/magazine NUL shard,shard,..." (NUL committing, for a ring before the commit)."""
    return f"{key}\0{','.join(map(str, shards))}".encode() + (b"\0" + COMMITTING.encode() if committing else b"")


class LmdbDoorbell:
    """A store view's side of its environment's bell (`Storage.doorbell`): one clientId's magazines."""

    def __init__(self, bell: EnvironmentBell, client_id: str) -> None:
        self._bell = bell
        self._client = client_id

    def subscribe(self, magazines: Collection[str]) -> None:
        # A subscription's cursor is rung by its topic's loads (the listener marks the topic's activity, which its
        # cursors follow: ignis.activity), after their commits: a cursor's claim reads the topic without the
        # store's write lock (its claims commit in the cursor's own environment), so it cannot wait a commit out.
        self._bell.subscribe(self._client, {AFTER_COMMIT + topic if (topic := names.cursor_topic(m)) else m
                                            for m in magazines})

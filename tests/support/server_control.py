"""Stopping, killing and restarting a real Aerospike node for the fault tests.

A node is found by the port it serves clients on: the process listening there on this machine (psutil), so
the tests can signal it (SIGTERM = a graceful stop, SIGKILL = a crash) and start it again with the same
command line, working directory and environment. A node this machine cannot signal (a container, another
host) is controlled by a command instead: IGNIS_TEST_AEROSPIKE_CTL is a shell template run with `{action}`
(stop, kill or start) and `{port}` filled in, e.g. `docker {action} aerospike-{port}` with `stop`/`kill`/
`start` meaning what docker means by them.
"""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field

import psutil

CTL_ENV = "IGNIS_TEST_AEROSPIKE_CTL"


def _listening_pid(port: int) -> int | None:
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid:
            return conn.pid
    return None


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


@dataclass
class Node:
    host: str
    port: int
    cmdline: list[str] = field(default_factory=list)
    cwd: str | None = None
    env: dict[str, str] | None = None
    pid: int | None = None

    @classmethod
    def find(cls, host: str, port: int) -> Node | None:
        """The node serving `host:port`, if this machine can control it (a command template, or its process
        here); None otherwise."""
        if os.environ.get(CTL_ENV):
            return cls(host, port)
        pid = _listening_pid(port)
        if pid is None:
            return None
        try:
            proc = psutil.Process(pid)
            return cls(host, port, proc.cmdline(), proc.cwd(), proc.environ(), pid)
        except psutil.Error:  # not ours to look at (another user): cannot restart it either
            return None

    def _ctl(self, action: str) -> None:
        template = os.environ[CTL_ENV]
        subprocess.run(template.format(action=action, port=self.port), shell=True, check=True, timeout=180,
                       stdout=subprocess.DEVNULL)

    def _signal(self, sig: int, wait: float) -> None:
        if os.environ.get(CTL_ENV):
            self._ctl("kill" if sig == signal.SIGKILL else "stop")
            return
        assert self.pid is not None
        try:
            proc = psutil.Process(self.pid)
            proc.send_signal(sig)
            proc.wait(wait)
        except psutil.NoSuchProcess:
            pass
        deadline = time.monotonic() + wait
        while port_open(self.host, self.port) and time.monotonic() < deadline:
            time.sleep(0.1)

    def stop(self, wait: float = 120.0) -> None:
        """SIGTERM, then wait until the process is gone (a graceful stop flushes and exits)."""
        self._signal(signal.SIGTERM, wait)

    def kill(self) -> None:
        """SIGKILL: a crash."""
        self._signal(signal.SIGKILL, 30.0)

    def start(self, ready_timeout: float = 120.0) -> None:
        """Start it again as it was started, and wait until it serves clients (the port answers and a write
        and a read of a probe record succeed)."""
        if os.environ.get(CTL_ENV):
            self._ctl("start")
        else:
            proc = subprocess.Popen(self.cmdline, cwd=self.cwd, env=self.env, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
            self.pid = proc.pid
        wait_serving(self.host, self.port, ready_timeout)
        if not os.environ.get(CTL_ENV):
            self.pid = _listening_pid(self.port) or self.pid

    def describe(self) -> str:
        return f"{self.host}:{self.port}" + (f" pid {self.pid}" if self.pid else "")


def wait_serving(host: str, port: int, timeout: float, namespace: str = "test") -> None:
    """Until a node at host:port accepts a write and a read (its namespace is loaded: a restart reads the
    device first)."""
    import aerospike

    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        if port_open(host, port):
            client = None
            try:
                client = aerospike.client({"hosts": [(host, port)], "policies": {"total_timeout": 2000}}).connect()
                key = (namespace, "ignis_fault_probe", f"probe-{port}")
                client.put(key, {"at": int(time.time())}, policy={"ttl": 60})
                client.get(key)
                return
            except Exception as exc:  # still starting
                last = exc
            finally:
                if client is not None:
                    client.close()
        time.sleep(0.25)
    raise TimeoutError(f"aerospike {host}:{port} did not serve within {timeout:g} s: {last}")


def info(host: str, port: int, command: str, timeout: float = 3.0) -> str:
    """One info command on one node (Aerospike's info protocol: version 2, type 1, 48-bit length)."""
    import struct

    body = (command + "\n").encode()
    with socket.create_connection((host, port), timeout=timeout) as conn:
        conn.sendall(struct.pack(">Q", (2 << 56) | (1 << 48) | len(body)) + body)
        header = b""
        while len(header) < 8:
            chunk = conn.recv(8 - len(header))
            if not chunk:
                raise ConnectionError(f"{host}:{port} closed the info connection")
            header += chunk
        size = struct.unpack(">Q", header)[0] & 0xFFFFFFFFFFFF
        data = b""
        while len(data) < size:
            chunk = conn.recv(size - len(data))
            if not chunk:
                break
            data += chunk
    text = data.decode(errors="replace")
    return text.split("\t", 1)[1].strip() if "\t" in text else text.strip()


def namespace_config(host: str, port: int, namespace: str) -> dict[str, str]:
    """The node's `namespace/<ns>` info answer, as a dict (its configuration and statistics)."""
    answer = info(host, port, f"namespace/{namespace}")
    if answer.startswith("ERROR") or "=" not in answer:
        raise ValueError(f"{host}:{port} has no namespace {namespace!r}: {answer[:120]}")
    return dict(item.split("=", 1) for item in answer.split(";") if "=" in item)


def restart_loses_data(host: str, port: int, namespace: str) -> str | None:
    """Why a restart of this node would empty `namespace`, or None when its data survives one: a namespace on
    a device or file (storage-engine device, or pmem), or in memory backed by files or devices (Aerospike 7+:
    "storage-engine memory" persisted with `file` or `device` lines), reads its records back at start; one
    purely in memory starts empty."""
    config = namespace_config(host, port, namespace)
    engine = config.get("storage-engine", "")
    backed = any(k.startswith(("storage-engine.file[", "storage-engine.device[")) for k in config)
    if engine in ("device", "pmem") or (engine == "memory" and backed):
        return None
    return (f"namespace {namespace!r} at {host}:{port} keeps its data in memory only (storage-engine "
            f"{engine or 'unknown'}, no file or device): a restart would empty it, so no restart test runs there")


def _stats(host: str, port: int) -> dict[str, str]:
    return dict(item.split("=", 1) for item in info(host, port, "statistics").split(";") if "=" in item)


def settle(nodes: list[tuple[str, int]], timeout: float = 180.0) -> float:
    """Wait until the running nodes of `nodes` form one cluster of all of them, with no migrations left
    (cluster_size, cluster_integrity, migrate_partitions_remaining, and `cluster-stable` agreeing on one
    cluster key), twice in a row. Returns when it held (time.monotonic())."""
    deadline = time.monotonic() + timeout
    streak = 0
    last = ""
    while time.monotonic() < deadline:
        up = [(h, p) for h, p in nodes if port_open(h, p)]
        try:
            keys = set()
            for h, p in up:
                stats = _stats(h, p)
                if int(stats.get("cluster_size", 0)) != len(up) or stats.get("cluster_integrity") != "true" \
                        or int(stats.get("migrate_partitions_remaining", 1)) != 0:
                    raise ValueError(f"{h}:{p} {stats.get('cluster_size')} nodes, "
                                     f"{stats.get('migrate_partitions_remaining')} partitions to migrate")
                keys.add(info(h, p, f"cluster-stable:size={len(up)};ignore-migrations=false"))
            if len(keys) != 1 or any(k.startswith("ERROR") for k in keys):
                raise ValueError(f"cluster-stable: {keys}")
            streak += 1
            if streak >= 2:
                return time.monotonic()
        except (OSError, ValueError) as exc:
            streak, last = 0, str(exc)
        time.sleep(0.5)
    raise TimeoutError(f"the cluster did not settle within {timeout:g} s: {last}")


def parse_hosts(target: str) -> tuple[list[tuple[str, int]], str]:
    """`h:p,h:p/ns` -> ([(h, p), ...], ns)."""
    hosts, _, namespace = target.partition("/")
    out = []
    for part in hosts.split(","):
        host, _, port = part.strip().rpartition(":")
        out.append((host or "127.0.0.1", int(port or 3000)))
    return out, namespace or "test"


def quoted(cmdline: list[str]) -> str:
    return " ".join(shlex.quote(c) for c in cmdline)

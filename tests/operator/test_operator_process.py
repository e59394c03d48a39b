"""`ignis operator` as a process: kubeconfig login, cluster-wide watch, probes and metrics on --port,
graceful stop on SIGTERM. The cluster is kmock's API emulator. (The --namespace filter is covered by the
in-process tests: with it kopf lists /api/v1/namespaces, a path kmock 0.8 cannot parse.)"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
import time
from pathlib import Path

import aiohttp
import pytest
import yaml
from ignis_operator.emulation import declare_resources
from ignis_operator.handlers import GROUP, PLURAL, VERSION
from kmock import KubernetesEmulator
from support.polling import http_get

from ignis.storage import open_store

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(180)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])




async def test_operator_process_end_to_end(kmock: KubernetesEmulator, tmp_path: Path) -> None:
    declare_resources(kmock)
    server = str(kmock.url).rstrip("/")
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "emu",
        "clusters": [{"name": "emu", "cluster": {"server": server}}],
        "contexts": [{"name": "emu", "context": {"cluster": "emu", "user": "me"}}],
        "users": [{"name": "me", "user": {"token": "test"}}]}))
    store_url = f"lmdb://{tmp_path}/store?durability=fast"
    port = free_port()
    env = {**os.environ, "KUBECONFIG": str(kubeconfig), "IGNIS_STORE": store_url}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "ignis.cli.app", "operator", "--port", str(port),
        env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    try:
        async with aiohttp.ClientSession(base_url=server) as session:
            for namespace in ("ns1", "ns2"):
                body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "IgnisQueue",
                        "metadata": {"name": "orders", "namespace": namespace, "uid": f"u-{namespace}",
                                     "resourceVersion": "1", "generation": 1,
                                     "creationTimestamp": "2026-01-01T00:00:00Z"},
                        "spec": {"handlerType": "orders.v1", "shards": 2}}
                async with session.post(f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}", json=body) as r:
                    assert r.status < 300

        store = open_store(store_url)
        try:
            deadline = time.monotonic() + 60
            while store.with_client("ns1").get_queue("orders") is None:
                if proc.returncode is not None:
                    output = await proc.stdout.read() if proc.stdout else b""
                    pytest.fail(f"the operator exited early:\n{output.decode()[-3000:]}")
                assert time.monotonic() < deadline, "the operator did not sync the queue"
                await asyncio.sleep(0.1)
            while store.with_client("ns2").get_queue("orders") is None:  # cluster-wide: every namespace
                assert time.monotonic() < deadline, "the operator did not sync the second namespace"
                await asyncio.sleep(0.1)
        finally:
            store.close()
        status, text = await asyncio.to_thread(http_get, f"http://127.0.0.1:{port}/healthz")
        assert status == 200
        status, text = await asyncio.to_thread(http_get, f"http://127.0.0.1:{port}/readyz")
        assert status == 200 and "reachable" in text
        status, text = await asyncio.to_thread(http_get, f"http://127.0.0.1:{port}/metrics")
        assert status == 200 and 'ignis_operator_reconciles_total{result="Synced"}' in text
    finally:
        output = await stop(proc)
    assert proc.returncode == 0, output.decode()[-3000:]


async def stop(proc: asyncio.subprocess.Process) -> bytes:
    """SIGTERM the operator and return its output; SIGKILL it (and fail) if it does not stop in time,
    so a hung operator never outlives the test."""
    if proc.returncode is None:
        proc.send_signal(signal.SIGTERM)
    try:
        output, _ = await asyncio.wait_for(proc.communicate(), 60)
    except TimeoutError:
        proc.kill()
        output, _ = await proc.communicate()
        pytest.fail(f"the operator did not stop on SIGTERM:\n{output.decode()[-3000:]}")
    return output


async def test_manifest_mode_process(tmp_path: Path) -> None:
    """`ignis operator --manifests DIR`: syncs, serves probes and metrics, stops cleanly on SIGTERM."""
    store_url = f"lmdb://{tmp_path}/store?durability=fast"
    port = free_port()
    examples = Path(__file__).resolve().parents[2] / "examples" / "queues"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "ignis.cli.app", "--store", store_url, "operator", "--manifests", str(examples),
        "--port", str(port), "--interval", "0.2", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            status, text = await asyncio.to_thread(http_get, f"http://127.0.0.1:{port}/metrics")
            if status == 200 and text.count('ignis_operator_queues{state="Synced"} 3.0'):
                break
            if proc.returncode is not None:
                output = await proc.stdout.read() if proc.stdout else b""
                pytest.fail(f"the operator exited early:\n{output.decode()[-3000:]}")
            assert time.monotonic() < deadline, f"metrics never showed 3 synced queues:\n{text[-2000:]}"
            await asyncio.sleep(0.1)
        status, text = await asyncio.to_thread(http_get, f"http://127.0.0.1:{port}/readyz")
        assert status == 200
    finally:
        output = await stop(proc)
    assert proc.returncode == 0, output.decode()[-3000:]
    store = open_store(store_url)
    try:
        assert [r.name for r in store.list_queues(active=True)] == ["audit", "events", "orders"]
    finally:
        store.close()


@pytest.mark.parametrize(("probe_host", "listening"), [(None, "0.0.0.0"), ("127.0.0.1", "127.0.0.1")])
async def test_probe_host_setting(tmp_path: Path, probe_host: str | None, listening: str) -> None:
    """IGNIS_OPERATOR_PROBE_HOST is the address of the probes' port (a container on a host's network listens
    on loopback only with 127.0.0.1); by default every address, as a pod's port must be."""
    import psutil

    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "IGNIS_OPERATOR_PROBE_HOST"}
    if probe_host is not None:
        env["IGNIS_OPERATOR_PROBE_HOST"] = probe_host
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "ignis.cli.app", "--store", f"lmdb://{tmp_path}/store?durability=fast", "operator",
        "--manifests", str(tmp_path), "--port", str(port), env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while (await asyncio.to_thread(http_get, f"http://127.0.0.1:{port}/healthz"))[0] != 200:
            assert proc.returncode is None, "the operator exited early"
            assert time.monotonic() < deadline, "the probes never answered"
            await asyncio.sleep(0.1)
        bound = {c.laddr.ip for c in psutil.Process(proc.pid).net_connections(kind="tcp")
                 if c.status == psutil.CONN_LISTEN and c.laddr.port == port}
        assert bound == {listening}
    finally:
        output = await stop(proc)
    assert proc.returncode == 0, output.decode()[-3000:]

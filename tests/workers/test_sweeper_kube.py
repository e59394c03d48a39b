"""The sweeper reaches the Kubernetes API like the operator does (ignis/kube.py): in a pod through its
service account, otherwise through $KUBECONFIG or ~/.kube/config; an API error is one log line; and a
stopped sweeper closes its API client (no asyncio "Unclosed client session" ERROR at exit)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

import pytest
import yaml
from kubernetes_asyncio.client.exceptions import ApiException
from test_election import LeaseEmulator

from ignis.kube import KubeConfigError, describe_error, load_configuration

pytestmark = pytest.mark.timeout(120)


def kubeconfig(path: Path, server: str) -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "here",
        "clusters": [{"name": "here", "cluster": {"server": server}}],
        "contexts": [{"name": "here", "context": {"cluster": "here", "user": "me", "namespace": "ignis"}}],
        "users": [{"name": "me", "user": {"token": "kubeconfig-token"}}]}))
    return path


def service_account(directory: Path) -> Path:
    directory.mkdir()
    (directory / "token").write_text("service-account-token")
    (directory / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\n")  # loading only checks it is not empty
    return directory


@pytest.mark.asyncio
async def test_in_cluster_comes_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig(tmp_path / "kubeconfig", "https://elsewhere:6443")))
    configuration = await load_configuration(service_account(tmp_path / "sa"))
    assert configuration.host == "https://10.0.0.1:443"
    assert "service-account-token" in (configuration.api_key.get("BearerToken")
                                       or configuration.api_key.get("authorization", ""))


@pytest.mark.asyncio
async def test_outside_a_cluster_the_kubeconfig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig(tmp_path / "kubeconfig", "https://elsewhere:6443")))
    configuration = await load_configuration(tmp_path / "no-service-account")
    assert configuration.host == "https://elsewhere:6443"
    # A pod without a mounted token (automountServiceAccountToken: false) falls back the same way.
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    assert (await load_configuration(tmp_path / "no-service-account")).host == "https://elsewhere:6443"


@pytest.mark.asyncio
async def test_default_kubeconfig_and_clear_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".kube").mkdir()
    kubeconfig(tmp_path / ".kube" / "config", "https://home:6443")
    assert (await load_configuration(tmp_path / "none")).host == "https://home:6443"

    (tmp_path / ".kube" / "config").unlink()
    with pytest.raises(KubeConfigError, match=r"^no Kubernetes configuration: not in a cluster .* no kubeconfig at "):
        await load_configuration(tmp_path / "none")
    broken = tmp_path / "broken"
    broken.write_text("apiVersion: v1\nkind: Config\ncurrent-context: nowhere\n")
    monkeypatch.setenv("KUBECONFIG", str(broken))
    with pytest.raises(KubeConfigError, match=rf"^kubeconfig {broken}: ") as caught:
        await load_configuration(tmp_path / "none")
    assert "\n" not in str(caught.value)


def test_an_api_error_is_one_line() -> None:
    exc = ApiException(status=403, reason="Forbidden")
    exc.headers = {"Audit-Id": "1", "Content-Type": "application/json", "X-Kubernetes-Pf-Prioritylevel-Uid": "2"}
    exc.body = (b'{"kind":"Status","apiVersion":"v1","status":"Failure","message":"leases.coordination.k8s.io '
                b'\\"ignis-sweeper\\" is forbidden: User \\"system:serviceaccount:ignis:x\\" cannot patch '
                b'resource \\"leases\\"","reason":"Forbidden","code":403}')
    assert "\n" in str(exc)  # what the sweeper used to log: headers and body over several lines
    assert describe_error(exc) == ('HTTP 403 Forbidden: leases.coordination.k8s.io "ignis-sweeper" is forbidden: '
                                   'User "system:serviceaccount:ignis:x" cannot patch resource "leases"')
    assert describe_error(ConnectionRefusedError(111, "Connect call failed")) == \
        "ConnectionRefusedError: [Errno 111] Connect call failed"


@pytest.mark.asyncio
@pytest.mark.kmock(cls=LeaseEmulator)
async def test_sweeper_outside_the_cluster_leads_through_a_kubeconfig_and_stops_cleanly(kmock, tmp_path: Path
                                                                                         ) -> None:
    """`ignis sweeper` with IGNIS_SWEEPER_LEASE=kubernetes and only a KUBECONFIG: it takes the Lease, and on
    SIGTERM releases it and exits 0 without an ERROR line (the API client is closed)."""
    config = kubeconfig(tmp_path / "kubeconfig", str(kmock.url).rstrip("/"))
    env = {**os.environ, "KUBECONFIG": str(config), "IGNIS_SWEEPER_LEASE": "kubernetes",
           "IGNIS_SWEEPER_LEASE_NAMESPACE": "ignis", "IGNIS_SWEEPER_IDENTITY": "outside-1",
           "IGNIS_SWEEPER_RETRY_PERIOD_SECONDS": "0.2", "IGNIS_SWEEPER_RENEW_DEADLINE_SECONDS": "1",
           "IGNIS_SWEEPER_LEASE_DURATION_SECONDS": "2", "PYTHONASYNCIODEBUG": "0"}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "ignis.cli.app", "--store", f"lmdb://{tmp_path}/store?durability=fast", "sweeper",
        "--port", "-1", env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while holder(kmock) != "outside-1":
            assert proc.returncode is None, (await proc.stdout.read()).decode() if proc.stdout else ""
            assert time.monotonic() < deadline, "the sweeper never took the Lease"
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.6)  # a few renewals over the client's pooled connections
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        output, _ = await asyncio.wait_for(proc.communicate(), 60)
    text = output.decode()
    assert proc.returncode == 0, text
    assert "leading with epoch" in text and "released the lease" in text, text
    assert holder(kmock) == ""
    assert "Unclosed" not in text, text
    assert " ERROR " not in text, text


def holder(emulator: LeaseEmulator) -> str | None:
    for (resource, namespace, name), obj in list(emulator.objects.items()):
        if resource.plural == "leases" and namespace == "ignis" and name == "ignis-sweeper" and not obj.deleted:
            return (obj.raw.get("spec") or {}).get("holderIdentity")
    return None

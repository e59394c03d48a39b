"""The container images (Dockerfile, deploy/image/): hadolint finds nothing in the Dockerfile and shellcheck
nothing in the image scripts; the base is pinned by tag and digest where Renovate and Dependabot update it;
the two targets are there; the builder's requirement files pin exactly what each image installs; and the
check script skips with one line where podman is absent. Building and running the images is
deploy/image/check.sh's job (it needs podman): CI lints, it does not build."""

from __future__ import annotations

import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
IMAGE_DIR = ROOT / "deploy" / "image"
SCRIPTS = sorted(IMAGE_DIR.glob("*.sh"))


def tool(name: str) -> str:
    """A linter from the test extra (its binary ships in the wheel), beside this interpreter or on PATH."""
    found = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is missing: pip install -e '.[test]' installs it")
    return found


def hadolint(path: Path) -> subprocess.CompletedProcess[str]:
    # style is the lowest severity: any finding fails (ignores are inline, each with its reason).
    return subprocess.run([tool("hadolint"), "--no-color", "--failure-threshold", "style", str(path)],
                          capture_output=True, text=True, timeout=60)


def test_hadolint_finds_nothing_in_the_dockerfile() -> None:
    done = hadolint(DOCKERFILE)
    assert (done.returncode, done.stdout + done.stderr) == (0, "")


def test_hadolint_fails_a_dockerfile_with_the_old_mistakes(tmp_path: Path) -> None:
    """The lint is live: an unpinned base, an unpinned apt install with its lists kept, root at the end."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:3.11-slim\nRUN apt-get update && apt-get install -y openjdk-17-jre-headless\n"
                   "RUN pip install pyspark\n")
    done = hadolint(bad)
    assert done.returncode != 0
    assert {"DL3008", "DL3009", "DL3013", "DL3015", "DL3042"} <= set(re.findall(r"DL\d{4}", done.stdout))


def test_the_dockerfile_ignores_a_rule_only_inline_with_its_reason() -> None:
    lines = DOCKERFILE.read_text().splitlines()
    ignores = [i for i, line in enumerate(lines) if "hadolint ignore" in line]
    assert ignores, "no ignore: then drop this test"
    for i in ignores:
        assert lines[i].startswith("# hadolint ignore=") and lines[i + 1].startswith("RUN ")
        assert lines[i - 1].startswith("# ") and "hadolint" not in lines[i - 1], "an ignore needs its reason above"
    assert not (ROOT / ".hadolint.yaml").exists()


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_shellcheck_finds_nothing_in_the_image_scripts(script: Path) -> None:
    done = subprocess.run([tool("shellcheck"), str(script)], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout + done.stderr) == (0, "")
    assert os.access(script, os.X_OK), f"{script.name} is not executable"


def stages() -> dict[str, str]:
    """Stage name -> what it is FROM."""
    return {m[2]: m[1] for m in re.finditer(r"^FROM\s+(\S+)\s+AS\s+(\S+)\s*$", DOCKERFILE.read_text(), re.M)}


def test_the_base_is_pinned_by_tag_and_digest_as_a_build_argument() -> None:
    text = DOCKERFILE.read_text()
    (default,) = re.findall(r"^ARG BASE_IMAGE=(\S+)$", text, re.M)
    # name:tag@sha256:digest, the form Renovate's and Dependabot's docker managers update
    assert re.fullmatch(r"python:3\.11-slim-(trixie|bookworm)@sha256:[0-9a-f]{64}", default)
    assert text.index("ARG BASE_IMAGE=") < text.index("FROM ")  # usable in every FROM
    froms = stages()
    assert froms["builder"] == froms["ignismq"] == "${BASE_IMAGE}"


def test_two_targets_the_small_one_by_default_and_the_charts() -> None:
    froms = stages()
    assert froms["ignismq-spark"] == "ignismq"  # shares the small image's layers
    last = list(froms)[-1]
    assert froms[last] == "ignismq", "a plain `podman build .` must make the small image"
    values = yaml.safe_load((ROOT / "helm" / "ignismq" / "values.yaml").read_text())
    assert values["image"]["repository"] == "ignismq" and "ignismq" in froms


def test_each_final_stage_ends_as_the_charts_user_with_the_ignis_entrypoint() -> None:
    text = DOCKERFILE.read_text()
    for name in ("ignismq", "ignismq-spark"):
        body = text.split(f" AS {name}\n", 1)[1].split("\nFROM ", 1)[0]
        assert re.findall(r"^USER (\S+)$", body, re.M)[-1] == "10001:10001"  # the chart's runAsUser/Group
        assert "--no-index" in body and "--require-hashes" in body  # the builder's wheels, nothing fetched
    small = text.split(" AS ignismq\n", 1)[1].split("\nFROM ", 1)[0]
    assert 'ENTRYPOINT ["ignis"]' in small and "IGNIS_STORE=lmdb:///data" in small and "HOME=/tmp" in small
    spark = text.split(" AS ignismq-spark\n", 1)[1].split("\nFROM ", 1)[0]
    # the slim bases' missing man1, made before the JRE's post-install needs it; JREs Spark 4 supports
    assert spark.index("mkdir -p /usr/share/man/man1") < spark.index("apt-get install")
    assert "for v in 21 17" in spark


def make_wheel(directory: Path, name: str, version: str, requires: list[str], extras: tuple[str, ...] = ()) -> Path:
    """A minimal pure-Python wheel (metadata only) that pip can resolve."""
    stem = f"{name.replace('-', '_')}-{version}"
    path = directory / f"{stem}-py3-none-any.whl"
    metadata = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    metadata += [f"Provides-Extra: {extra}" for extra in extras] + [f"Requires-Dist: {r}" for r in requires]
    info = f"{stem}.dist-info"
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as wheel:
        wheel.writestr(f"{name.replace('-', '_')}/__init__.py", "")
        wheel.writestr(f"{info}/METADATA", "\n".join(metadata) + "\n")
        wheel.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                        "Tag: py3-none-any\n")
        wheel.writestr(f"{info}/RECORD", "")
    path.write_bytes(buffer.getvalue())
    return path


def test_the_requirement_files_pin_each_images_wheels_by_hash(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    make_wheel(wheels, "ignismq", "0.1.0", ["core-dep>=1", 'spark-dep==2.0; extra == "spark"'], extras=("spark",))
    make_wheel(wheels, "core-dep", "1.5", [])
    make_wheel(wheels, "spark-dep", "2.0", ["shared-dep"])
    make_wheel(wheels, "shared-dep", "3.0", [])
    make_wheel(wheels, "unrelated", "9.9", [])  # in the directory, needed by neither image
    done = subprocess.run([sys.executable, str(IMAGE_DIR / "requirements-from-wheels.py"), str(wheels)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr

    def pins(name: str) -> dict[str, str]:
        lines = [line for line in (wheels / name).read_text().splitlines() if not line.startswith("#")]
        return dict(line.split(" --hash=sha256:") for line in lines)

    def sha(wheel: str) -> str:
        return hashlib.sha256((wheels / wheel).read_bytes()).hexdigest()

    assert pins("ignismq.txt") == {"ignismq==0.1.0": sha("ignismq-0.1.0-py3-none-any.whl"),
                                   "core-dep==1.5": sha("core_dep-1.5-py3-none-any.whl")}
    assert pins("ignismq-spark.txt") == {**pins("ignismq.txt"),
                                         "spark-dep==2.0": sha("spark_dep-2.0-py3-none-any.whl"),
                                         "shared-dep==3.0": sha("shared_dep-3.0-py3-none-any.whl")}


def test_the_check_skips_in_one_line_without_podman(tmp_path: Path) -> None:
    """Where podman is absent the check says so and passes: nothing else runs (CI lints, it does not build)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("dirname", "bash"):  # all the script needs before it looks for podman
        (bin_dir / name).symlink_to(shutil.which(name))
    done = subprocess.run([str(bin_dir / "bash"), str(IMAGE_DIR / "check.sh")], capture_output=True, text=True,
                          env={"PATH": str(bin_dir)}, timeout=60)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.splitlines() == [
        "check: SKIPPED: podman is not installed (Debian: apt-get install -y podman), so no image was built or run"]

"""Run by the Dockerfile's builder stage: writes the exact set of wheels each image installs, with their
sha256, as pip requirement files beside the wheels:

    ignismq.txt        ignismq==VERSION and every dependency it resolves to
    ignismq-spark.txt  the same for ignismq[spark]

The final stages COPY their file (a change to any wheel changes it, so the layer cache can never keep an
install of older wheels: a RUN's bind mount of the builder's files is not part of buildah's cache key) and
install with `pip install --no-index --require-hashes --requirement FILE`. The file stays in the image as
the record of what it holds. Usage: requirements-from-wheels.py WHEEL_DIR
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from urllib.parse import unquote, urlparse


def resolve(wheels: Path, requirement: str) -> list[str]:
    """`name==version --hash=sha256:...` for every distribution pip installs for `requirement` from `wheels`
    alone, whatever the builder itself has installed."""
    with tempfile.TemporaryDirectory() as tmp:
        report_path = Path(tmp) / "report.json"
        subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--ignore-installed",
                        "--no-index", "--find-links", str(wheels), "--report", str(report_path), requirement],
                       check=True)
        report = json.loads(report_path.read_text())
    lines = []
    for item in report["install"]:
        wheel = wheels / Path(unquote(urlparse(item["download_info"]["url"]).path)).name
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        meta = item["metadata"]
        lines.append(f"{meta['name']}=={meta['version']} --hash=sha256:{digest}")
    return sorted(lines, key=str.lower)


def main(wheels: Path) -> None:
    (project,) = wheels.glob("ignismq-*.whl")
    version = project.name.split("-")[1]
    for name, requirement in (("ignismq", f"ignismq=={version}"), ("ignismq-spark", f"ignismq[spark]=={version}")):
        lines = resolve(wheels, requirement)
        header = f"# {requirement}: what the {name} image installs (deploy/image/requirements-from-wheels.py)\n"
        (wheels / f"{name}.txt").write_text(header + "\n".join(lines) + "\n")
        print(f"requirements-from-wheels: {name}.txt, {len(lines)} distributions")


if __name__ == "__main__":
    main(Path(sys.argv[1]))

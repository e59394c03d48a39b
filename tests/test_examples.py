"""The example producer and consumer work as their docstrings say, through the real console script."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
IGNIS = str(Path(sys.executable).parent / "ignis")


def run(*argv: str, env: dict[str, str]) -> str:
    done = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_producer_then_consumer(tmp_path: Path) -> None:
    env = {**os.environ, "IGNIS_STORE": f"lmdb://{tmp_path}/store?durability=fast"}
    run(IGNIS, "queue", "apply", "-f", "examples/queues/orders.yaml", env=env)
    assert "published 21 orders" in run(sys.executable, "examples/producer.py", "--count", "20", env=env)
    out = run(sys.executable, "examples/consumer.py", "--drain", env=env)
    assert out.count("order ") == 21
    assert "'acked': 21" in out
    stats = json.loads(run(IGNIS, "stats", "orders", "-o", "json", env=env))
    assert (stats["published"], stats["consumed"], stats["depth"]) == (21, 21, 0)

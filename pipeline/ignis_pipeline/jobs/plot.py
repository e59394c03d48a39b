"""`stats --plot FILE.png`: the backlog-age distribution and the depth per shard, drawn with matplotlib."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ignis.errors import InvalidInputError


def plot(doc: dict[str, Any], path: Path) -> Path:
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: no display needed
        import matplotlib.pyplot as plt
    except ImportError:
        raise InvalidInputError("--plot needs matplotlib: pip install 'ignismq[spark]'") from None
    if path.suffix.lower() != ".png":
        raise InvalidInputError(f"--plot {path}: the file name must end in .png")
    rows = doc["magazines"]
    fig, (ages, shards) = plt.subplots(2, 1, figsize=(11, 8), constrained_layout=True)
    if not rows:
        ages.text(0.5, 0.5, "no messages", ha="center", va="center")
    labels = list(rows[0]["ageHistogram"]) if rows else []
    width = 0.8 / max(len(rows), 1)
    for i, row in enumerate(rows):
        name = f"{row['queue']}/{row['magazine']}"
        ages.bar([x + i * width for x in range(len(labels))], list(row["ageHistogram"].values()), width, label=name)
        shard_ids = [int(s) for s in row["shards"]]
        shards.bar([s + i * width for s in shard_ids], list(row["shards"].values()), width, label=name)
    ages.set_xticks([x + 0.4 - width / 2 for x in range(len(labels))], labels)
    ages.set(title="backlog age", xlabel="age of message (since publish)", ylabel="messages")
    shards.set(title="depth per shard", xlabel="shard", ylabel="messages stored")
    for axis in (ages, shards):
        if rows:
            axis.legend(fontsize="small")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path

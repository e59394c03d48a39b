"""`stats --plot FILE.png`: the backlog-age distribution and the messages stored per shard, drawn with matplotlib."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ignis.errors import InvalidInputError


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: no display needed
        import matplotlib.pyplot as plt
    except ImportError:
        raise InvalidInputError("--plot needs matplotlib: pip install 'ignismq[spark]'") from None
    return plt


def figure(doc: dict[str, Any]) -> Any:
    """The figure of a stats document: ages above, messages stored per shard below (the caller closes it)."""
    plt = _pyplot()
    from matplotlib.ticker import MaxNLocator

    rows = doc["magazines"]
    fig, (ages, shards) = plt.subplots(2, 1, figsize=(11, 8), constrained_layout=True)
    if not rows:
        ages.text(0.5, 0.5, "no messages", ha="center", va="center")
    labels = list(rows[0]["ageHistogram"]) if rows else []
    width = 0.8 / max(len(rows), 1)
    for i, row in enumerate(rows):
        name = f"{row['queue']}/{row['magazine']}"
        ages.bar([x + i * width for x in range(len(labels))], list(row["ageHistogram"].values()), width, label=name)
        # Each shard's bars side by side, centred on the shard's number.
        offset = (i - (len(rows) - 1) / 2) * width
        shards.bar([int(s) + offset for s in row["shards"]], list(row["shards"].values()), width, label=name)
    ages.set_xticks([x + 0.4 - width / 2 for x in range(len(labels))], labels)
    ages.set(title="backlog age", xlabel="age of message (since publish)", ylabel="messages")
    # Shards are numbered 0..n-1: whole-number ticks, none past the highest shard that holds messages.
    highest = max((int(s) for row in rows for s in row["shards"]), default=0)
    shards.set_xlim(-0.5, highest + 0.5)
    shards.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
    shards.set(title="messages stored per shard", xlabel="shard", ylabel="messages stored")
    for axis in (ages, shards):
        if rows:
            axis.legend(fontsize="small")
    return fig


def plot(doc: dict[str, Any], path: Path) -> Path:
    if path.suffix.lower() != ".png":
        raise InvalidInputError(f"--plot {path}: the file name must end in .png")
    fig = figure(doc)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    _pyplot().close(fig)
    return path

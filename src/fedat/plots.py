"""PNG plots of a run, like the paper's figures: accuracy vs time and vs cumulative uploaded bytes."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def plot_run(folder: Path) -> None:
    """Write accuracy_vs_time.png and accuracy_vs_bytes.png from folder/events.jsonl."""
    evals = [
        e for e in map(json.loads, (folder / "events.jsonl").read_text().splitlines()) if e["event"] == "evaluation"
    ]
    if not evals:
        return
    t = [e["time"] for e in evals]
    acc = [e["accuracy"] for e in evals]
    up = [e["bytes_up"] / 1e6 for e in evals]
    for name, x, label in (
        ("accuracy_vs_time.png", t, "wall-clock time (s)"),
        ("accuracy_vs_bytes.png", up, "cumulative uploaded MB"),
    ):
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot(x, acc, marker=".")
        ax.set_xlabel(label)
        ax.set_ylabel("mean client test accuracy")
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(folder / name, dpi=100)
        plt.close(fig)

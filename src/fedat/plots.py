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


def plot_comparison(folder: Path, results) -> None:
    """All methods on one chart: accuracy vs time, and accuracy vs cumulative uploaded MB (log x)."""
    for name, xlabel, pick, log in (
        ("compare_accuracy_vs_time.png", "wall-clock time (s)", lambda p: p[0], False),
        ("compare_accuracy_vs_bytes.png", "cumulative uploaded MB", lambda p: max(p[2], 1) / 1e6, True),
    ):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for r in results:
            if r.curve:
                ax.plot([pick(p) for p in r.curve], [p[1] for p in r.curve], marker=".", label=r.name)
        if log:
            ax.set_xscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("mean client test accuracy")
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(folder / name, dpi=100)
        plt.close(fig)

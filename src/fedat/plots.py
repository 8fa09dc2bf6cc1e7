"""PNG plots of a run, like the paper's figures: accuracy vs time and vs cumulative uploaded bytes; updates merged
per tier over time."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def plot_run(folder: Path) -> None:
    """Write accuracy_vs_time.png, accuracy_vs_bytes.png and updates_per_tier.png from folder/events.jsonl."""
    events = [json.loads(line) for line in (folder / "events.jsonl").read_text().splitlines() if line.strip()]
    plot_updates_per_tier(folder, events)
    evals = [e for e in events if e["event"] == "evaluation"]
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


def updates_per_tier(events: list[dict]) -> tuple[list[float], list[list[float]]]:
    """Times of the global versions and, per tier, the client updates merged into the global model up to each.

    From the `global` lines of events.jsonl, in version order: the growth of `updates` (all tiers) between two
    recorded versions goes to the tiers whose round counts (`tier_counts`) grew, in proportion; that is exact when
    no version is missing, and an estimate across versions the recorder skipped (its queue drops the oldest).
    """
    lines = sorted({e["version"]: e for e in events if e.get("event") == "global"}.values(), key=lambda e: e["version"])
    tiers = max((len(e.get("tier_counts", ())) for e in lines), default=0)
    times: list[float] = []
    cumulative: list[list[float]] = [[] for _ in range(tiers)]
    totals = [0.0] * tiers
    prev_updates, prev_counts = 0, [0] * tiers
    for e in lines:
        counts = list(e.get("tier_counts", ())) + [0] * (tiers - len(e.get("tier_counts", ())))
        grown = [max(0, c - p) for c, p in zip(counts, prev_counts, strict=True)]
        added = max(0, e.get("updates", 0) - prev_updates)
        if sum(grown):
            for m in range(tiers):
                totals[m] += added * grown[m] / sum(grown)
        elif 1 <= e.get("tier", 0) <= tiers:
            totals[e["tier"] - 1] += added
        times.append(e["time"])
        for m in range(tiers):
            cumulative[m].append(totals[m])
        prev_updates, prev_counts = max(prev_updates, e.get("updates", 0)), counts
    return times, cumulative


def plot_updates_per_tier(folder: Path, events: list[dict]) -> None:
    """Write updates_per_tier.png: client updates merged per tier, cumulative and per minute, against time."""
    times, cumulative = updates_per_tier(events)
    if not times or not cumulative:
        return
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
    span = max(times[-1] - times[0], 1.0)
    width = max(5.0, span / 30)  # seconds per bar of the rate plot; a last, partial bar is left out
    edges = [times[0] + i * width for i in range(max(1, int(span // width)) + 1)]
    for m, series in enumerate(cumulative, start=1):
        top.step(times, series, where="post", label=f"tier {m}")
        per_bin, j, last = [], 0, 0.0
        for edge in edges[1:]:
            while j < len(times) and times[j] <= edge:
                j += 1
            value = series[j - 1] if j else 0.0
            per_bin.append((value - last) * 60 / width)
            last = value
        bottom.step(edges, [*per_bin, per_bin[-1]], where="post", label=f"tier {m}")
    top.set_ylabel("client updates merged")
    bottom.set_ylabel(f"updates merged per minute ({width:.0f} s bins)")
    bottom.set_xlabel("wall-clock time (s)")
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(folder / "updates_per_tier.png", dpi=100)
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


def plot_sweep(path: Path, title: str, methods) -> None:
    """Accuracy vs virtual time of a sweep: per method the seeds' mean (dashed where fewer seeds ran on) and band."""
    from fedat.sweep import BAND_WINDOW, coverage, seed_band

    fig, ax = plt.subplots(figsize=(9, 5.5))
    for i, (method, records) in enumerate(methods.items()):
        colour = f"C{i % 10}"
        times, mean, lo, hi, n = seed_band(records)
        full = max(n)
        k = sum(1 for c in n if c == full)  # seeds stop one by one, so the full-count points come first
        ax.plot(times[:k], mean[:k], color=colour, linewidth=1.4, label=f"{method} ({coverage(records)})")
        if k < len(times):
            ax.plot(times[k - 1 :], mean[k - 1 :], color=colour, linewidth=1.0, linestyle="--")
        if full > 1:
            ax.fill_between(times, lo, hi, color=colour, alpha=0.12, linewidth=0)
    ax.set_title(
        f"{title}: mean over seeds of a {BAND_WINDOW:g}-s trailing mean; band = seeds' range; dashed = fewer seeds"
    )
    ax.title.set_fontsize(9)
    ax.set_xlabel("virtual time (s)")
    ax.set_ylabel("mean client test accuracy")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)

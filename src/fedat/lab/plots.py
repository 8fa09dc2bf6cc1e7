"""PNG plots of a run, like the paper's figures: accuracy vs time and vs cumulative uploaded bytes; updates merged
per tier over time; and the report's figures, drawn from sweep records."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import PIL  # noqa: E402
from PIL import Image, PngImagePlugin  # noqa: E402

# Bumped whenever a report figure's look changes: the digest a figure carries covers its data and this, so that a
# figure whose data and look are unchanged is left as it is (its bytes depend on the matplotlib and Pillow versions).
STYLE = 2
DATA_KEY = "fedat-data"


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


def plot_sweep(path: Path, title: str, methods) -> bool:
    """Accuracy vs virtual time of a sweep: per method the seeds' mean (dashed where fewer seeds ran on) and band.

    Returns whether the file was (re)written: a figure that already shows the same data is kept as it is."""
    from fedat.lab.sweep import BAND_WINDOW, coverage, seed_band

    bands = {m: seed_band(rs) for m, rs in methods.items()}
    legends = {m: f"{m} ({coverage(rs)})" for m, rs in methods.items()}
    digest = sweep_digest(title, methods)
    if png_data(path) == digest:
        return False
    fig, ax = plt.subplots(figsize=(8, 4.8))
    for i, method in enumerate(methods):
        colour = f"C{i % 10}"
        times, mean, lo, hi, n = bands[method]
        minutes = [t / 60 for t in times]
        full = max(n)
        k = sum(1 for c in n if c == full)  # seeds stop one by one, so the full-count points come first
        ax.plot(minutes[:k], mean[:k], color=colour, linewidth=1.3, label=legends[method])
        if k < len(times):
            ax.plot(minutes[k - 1 :], mean[k - 1 :], color=colour, linewidth=1.0, linestyle="--")
        if full > 1:
            ax.fill_between(minutes, lo, hi, color=colour, alpha=0.12, linewidth=0)
    ax.set_title(
        f"{title}: mean over seeds of a {BAND_WINDOW:g}-s trailing mean; band = seeds' range; dashed = fewer seeds"
    )
    ax.title.set_fontsize(8)
    ax.set_xlabel("virtual minutes")
    ax.set_ylabel("mean client test accuracy")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right", ncol=2 if len(methods) > 8 else 1)
    fig.tight_layout()
    save_png(fig, path, digest)
    return True


@dataclass(frozen=True)
class Series:
    """One method in a claim's figure: its seed band (virtual s, mean, low, high, seeds) and its MB to the target."""

    label: str
    band: tuple[list[float], list[float], list[float], list[float], list[int]]
    mb: list[float]  # MB (up + down) to the target, one per seed that reached it
    seeds: int


def plot_claim(path: Path, title: str, series: Sequence[Series], target: float) -> bool:
    """A claim's figure: accuracy against virtual time with a band over seeds, and MB to `target` as bars.

    Returns whether the file was (re)written: a figure that already shows the same data is kept as it is."""
    digest = claim_digest(title, series, target)
    if png_data(path) == digest:
        return False
    fig, (left, right) = plt.subplots(1, 2, figsize=(7.6, 2.7), gridspec_kw={"width_ratios": [2.1, 1]})
    for i, s in enumerate(series):
        colour = f"C{i % 10}"
        times, mean, lo, hi, n = s.band
        minutes = [t / 60 for t in times]
        left.plot(minutes, mean, color=colour, linewidth=1.2, label=f"{s.label} ({max(n, default=0)})")
        if max(n, default=0) > 1:
            left.fill_between(minutes, lo, hi, color=colour, alpha=0.15, linewidth=0)
        height = float(np.mean(s.mb)) if s.mb else 0.0
        spread = float(np.std(s.mb, ddof=1)) if len(s.mb) > 1 else 0.0
        right.bar(i, height, yerr=spread, color=colour, capsize=2)
        # "never" sits on the axis, where a log scale has no zero to put it at
        right.annotate(
            f"{len(s.mb)}/{s.seeds}" if s.mb else "never",
            (i, height + spread) if s.mb else (i, 0.02),
            xycoords="data" if s.mb else ("data", "axes fraction"),
            xytext=(0, 2),
            textcoords="offset points",
            ha="center",
            fontsize=6,
        )
    left.set_xlabel("virtual minutes", fontsize=7)
    left.set_ylabel("mean client accuracy", fontsize=7)
    left.grid(alpha=0.3)
    left.legend(fontsize=6, loc="lower right")
    left.set_title(title, fontsize=7, loc="left")
    right.set_xticks(range(len(series)), [s.label for s in series], rotation=25, ha="right", fontsize=6)
    right.set_ylabel(f"MB to {target:.2f} (seeds reaching)", fontsize=7)
    reached = [x for s in series for x in s.mb]
    if reached and max(reached) > 10 * min(reached):
        right.set_yscale("log")  # as the paper's traffic figures: methods differ by orders of magnitude
    right.grid(alpha=0.3, axis="y")
    for ax in (left, right):
        ax.tick_params(labelsize=6)
    fig.tight_layout(pad=0.4)
    save_png(fig, path, digest)
    return True


def sweep_digest(title: str, methods) -> str:
    """The data digest of `plot_sweep`'s figure."""
    from fedat.lab.sweep import coverage, seed_band

    return data_digest(["sweep", title, {m: [f"{m} ({coverage(rs)})", seed_band(rs)] for m, rs in methods.items()}])


def claim_digest(title: str, series: Sequence[Series], target: float) -> str:
    """The data digest of `plot_claim`'s figure."""
    return data_digest(["claim", title, target, [[s.label, s.band, s.mb, s.seeds] for s in series]])


def data_digest(data) -> str:
    """What a figure shows, as a short digest: its data rounded to 6 places, and the STYLE it is drawn in."""
    text = json.dumps([STYLE, data], sort_keys=True, default=str, allow_nan=True)
    text = json.dumps(json.loads(text, parse_float=lambda x: round(float(x), 6)), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def png_data(path: Path) -> str | None:
    """The data digest a report figure carries, or None (no file, or not one of ours)."""
    if not path.is_file():
        return None
    with Image.open(path) as img:
        return img.text.get(DATA_KEY) if hasattr(img, "text") else None


def save_png(fig, path: Path, digest: str) -> None:
    """Write `fig` as a small palette PNG carrying its data digest and the library versions that drew it; close it."""
    fig.canvas.draw()
    rgb = np.asarray(fig.canvas.buffer_rgba())[..., :3]
    plt.close(fig)
    # 64 colours hold lines, bands and text; a palette PNG is a quarter of the size of the RGBA one
    img = Image.fromarray(rgb).quantize(colors=64, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    info = PngImagePlugin.PngInfo()
    info.add_text(DATA_KEY, digest)
    info.add_text("Software", f"matplotlib {matplotlib.__version__}, Pillow {PIL.__version__}")
    path.parent.mkdir(parents=True, exist_ok=True)
    img.save(path, optimize=True, pnginfo=info)

"""Comparison tables shaped like the paper's: pure functions of each method's summary and evaluation curve."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

LATE_WARNING = 0.2  # above this, the shared workers could not keep up and wall-clock numbers flatter nobody


@dataclass(frozen=True)
class MethodResult:
    """One method's run: its summary and its evaluation curve (time s, accuracy, cumulative bytes up and down)."""

    name: str
    summary: Mapping
    curve: Sequence[tuple[float, float, int, int]]


def first_reaching(curve: Sequence[tuple[float, float, int, int]], target: float) -> tuple[float, int] | None:
    """(time, bytes up + down) of the first evaluation at or above `target`, or None if never reached."""
    for t, acc, up, down in curve:
        if acc >= target:
            return t, up + down
    return None


def tail_mean(curve: Sequence[tuple[float, float, int, int]], end: float, fraction: float = 0.25) -> float | None:
    """Mean accuracy of the evaluations in the last `fraction` of a run ending at `end` s; None if there are none.

    Less noisy than the best point, and not inflated by evaluating more often (the best of many noisy
    evaluations is higher than the best of a few, which favours methods that publish more versions).
    """
    tail = [acc for t, acc, _, _ in curve if t >= (1.0 - fraction) * end]
    return sum(tail) / len(tail) if tail else None


def quarter_rise(curve: Sequence[tuple[float, float, int, int]], end: float) -> float | None:
    """Last-quarter mean accuracy minus the quarter's before it: near 0 once a curve has flattened; None if either
    quarter has no evaluation."""
    last = tail_mean(curve, end)
    before = [acc for t, acc, _, _ in curve if 0.5 * end <= t < 0.75 * end]
    return None if last is None or not before else last - sum(before) / len(before)


def _pct(x: float) -> str:
    return f"{x * 100:+.2f} %"


def accuracy_table(results: Sequence[MethodResult], budget_seconds: float, reference: str = "fedat") -> str:
    """Table 1: best and last-quarter accuracy, per-client accuracy variance normalised to the reference's."""
    ref = next(r for r in results if r.name == reference)
    ref_var = ref.summary.get("best_accuracy_variance") or 0.0
    lines = [
        "| method | best accuracy | last-quarter mean | evaluations | norm. variance | late fraction |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        var = r.summary.get("best_accuracy_variance")
        norm = f"{var / ref_var:.2f}" if var is not None and ref_var else "—"
        late = r.summary.get("late_fraction", 0.0)
        flag = " ⚠ workers could not keep up" if late > LATE_WARNING else ""
        best = r.summary.get("best_accuracy")
        tail = tail_mean(r.curve, budget_seconds)  # curve times count from the end of start-up, like the budget
        cells = [
            f"{best:.3f}" if best is not None else "—",
            f"{tail:.3f}" if tail is not None else "—",
            str(len(r.curve)),
            norm,
            f"{late:.2f}{flag}",
        ]
        lines.append(f"| {r.name} | " + " | ".join(cells) + " |")
    baselines = [r.summary["best_accuracy"] for r in results if r.name != reference and r.summary.get("best_accuracy")]
    mine = ref.summary.get("best_accuracy")
    lines.append("")
    lines.append(f"{reference} absolute variance: {ref_var:.4g}" if ref_var else f"{reference}: no evaluation")
    if baselines and mine:
        lines.append(
            f"{reference} improvement over the best baseline: {_pct(mine / max(baselines) - 1)}; "
            f"over the worst: {_pct(mine / min(baselines) - 1)}"
        )
    return "\n".join(lines)


def traffic_table(results: Sequence[MethodResult], targets: Sequence[float], reference: str = "fedat") -> str:
    """Table 2 and time to target: MB (up + down) and seconds to reach each target, with the ratio to the reference."""
    head = "| method | " + " | ".join(f"MB to {t:.2f} | s to {t:.2f} | time vs {reference}" for t in targets) + " |"
    lines = [head, "|---|" + "---:|---:|---:|" * len(targets)]
    ref = next(r for r in results if r.name == reference)
    for r in results:
        cells = []
        for t in targets:
            hit, ref_hit = first_reaching(r.curve, t), first_reaching(ref.curve, t)
            if hit is None:
                cells += ["—", "—", "—"]
                continue
            ratio = f"{hit[0] / ref_hit[0]:.2f}×" if ref_hit and ref_hit[0] > 0 else "—"
            cells += [f"{hit[1] / 1e6:.1f}", f"{hit[0]:.0f}", ratio]
        lines.append(f"| {r.name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)

"""What `fedat run` prints while it runs and when it ends: one progress line at a steady rhythm, then a short table.

Pure text: the launcher gathers the numbers (the recorder's state, the profiler's metrics, the summary).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from fedat.lab.plan import LATE_LIMIT, RUN_MIN_UPDATES, clock


def progress_every(budget_seconds: float) -> float:
    """Seconds between progress lines: about a dozen lines for a short run, a line a minute at most for a long one."""
    if budget_seconds <= 240:
        return 10.0
    return 30.0 if budget_seconds <= 1200 else 60.0


def tiered_clients(metrics_text: str) -> int:
    """Clients in some tier, from the profiler's `fedat_tier_clients` gauges (0 before the first assignment)."""
    return int(
        sum(
            float(line.rsplit(" ", 1)[1])
            for line in metrics_text.splitlines()
            if line.startswith("fedat_tier_clients{")
        )
    )


def late_share(late: int, updates: int) -> str:
    """ "3 % (7 of 251)", or "-" before any update."""
    return f"{late / updates:.0%} ({late} of {updates})" if updates else "-"


def progress_line(
    elapsed: float,
    budget: float,
    version: int,
    tier_counts: Sequence[int],
    tiered: int | None,
    clients: int,
    accuracy: float | None,
    late: int,
    updates: int,
) -> str:
    """elapsed / budget, global version, rounds per tier, clients tiered, latest accuracy, late updates."""
    rounds = " ".join(str(n) for n in tier_counts) if tier_counts else "-"
    acc = "-" if accuracy is None or math.isnan(accuracy) else f"{accuracy:.3f}"
    tiers = "?" if tiered is None else str(tiered)
    return (
        f"[fedat] {clock(elapsed):>5} / {clock(budget)}  version {version:4d}  rounds per tier {rounds}  "
        f"tiered {tiers}/{clients}  accuracy {acc}  late {late_share(late, updates)}"
    )


def keeping_up(late: int, updates: int, limit: float = LATE_LIMIT) -> bool | None:
    """Whether the workers follow the latency model (late share within `limit`); None while too few updates."""
    if updates < RUN_MIN_UPDATES:
        return None
    return late / updates <= limit


def falling_behind(late: int, updates: int, limit: float = LATE_LIMIT) -> str:
    """The warning printed once when a run's late share passes the limit and its time scale may not change."""
    return (
        f"[fedat] the workers are falling behind the latency model: {late_share(late, updates)} of the updates are "
        f"late (limit {limit:.0%}); other work on this machine takes their cores. The results still count, but the "
        "tiers' timing is not quite the experiment's: run again when the machine is quieter (the probe measures it "
        "again and picks a larger time scale)."
    )


def end_table(summary: dict, plots: Sequence[str]) -> str:
    """The few numbers a person reads at the end, and where the rest is."""
    cal = summary.get("calibration") or {}
    lm = summary.get("latency_model") or {}
    rows = [("run", f"{clock(summary['wall_seconds'])} in {summary['run_dir']}")]
    if cal:
        changes = "".join(f", then {c['to']} from {clock(c['at_seconds'])}" for c in cal.get("time_scale_changes", []))
        rows.append(("time scale", f"{lm.get('time_scale')} (the file's {cal['reference_time_scale']}){changes}"))
        rows.append(("chosen as", cal["reason"]))
    else:
        rows.append(("time scale", f"{lm.get('time_scale')}"))
    late = late_share(summary["late_updates"], summary["client_updates"])
    rows.append(("client updates", f"{summary['client_updates']}, late {late}"))
    rounds = " ".join(str(n) for n in summary["tier_rounds"]) or "-"
    rows.append(("global versions", f"{summary['global_updates']}, rounds per tier {rounds}"))
    if summary.get("best_accuracy") is not None:
        rows.append(
            (
                "accuracy",
                f"best {summary['best_accuracy']:.3f} (version {summary['best_version']}), "
                f"last {summary['final_accuracy']:.3f}, from {summary['first_accuracy']:.3f} at the start; "
                f"{summary['evaluations']} evaluations",
            )
        )
    u = summary.get("worker_utilisation")
    if u:
        rows.append(
            (
                "workers busy",
                f"{u['mean']} CPU-s/s each, {u['training_mean']} of the time training "
                f"(from {u.get('window', 'the first global update to the end of the run')}; "
                f"load average {summary.get('load_average')})",
            )
        )
    rows.append(("files", "summary.json, events.jsonl, logs/" + "".join(f", {p}" for p in plots)))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"[fedat] {k:<{width}}  {v}" for k, v in rows)

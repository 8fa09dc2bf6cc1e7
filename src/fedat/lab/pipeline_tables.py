"""The fault and scale tables of the pipeline, from the summaries `make chaos` and `make bench` write."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path


def pipeline_blocks(folder: Path) -> dict[str, str]:
    """The chaos and scale tables, from `folder`'s chaos-*.json and scale-*.json (the files `make chaos` and
    `make bench` write)."""
    chaos = [chaos_table(json.loads(p.read_text()), p.name) for p in sorted(folder.glob("chaos-*.json"))]
    scale = [scale_table(json.loads(p.read_text()), p.name) for p in sorted(folder.glob("scale-*.json"))]
    return {"chaos": "\n\n".join(chaos) or "No chaos summary yet.", "scale": "\n\n".join(scale) or "None yet."}


def chaos_table(d: Mapping, name: str) -> str:
    """One chaos run: what was killed, what the invariants found, how long the pipeline took to resume."""
    v, acc = d["violations"], d["accounted"]
    kills = ", ".join(f"{k} {n}" for k, n in sorted(d["kills"].items(), key=lambda kv: -kv[1]))
    resume = sorted(d["resume_after_kill_seconds"])
    broker = sorted(d["resume_after_broker_restart_seconds"])

    def median(xs: Sequence[float]) -> float:
        n = len(xs)
        return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2

    rows = [
        ("run", f"`{name}`: {d['minutes']:g} minutes, seed {d['seed']}, then the same run undisturbed"),
        ("kills per service", f"{kills} ({sum(d['kills'].values())})"),
        ("broker restarts", str(d["broker_restarts"])),
        (
            "updates lost / counted twice / dead-lettered by the broker",
            f"{v['updates_lost']} / {v['updates_counted_twice']} / {v['updates_dead_lettered_by_broker']} "
            f"({acc['updates']:,} updates: {acc['updates_merged']:,} merged, {acc['updates_answered_after_close']} "
            "answered after their round closed)",
        ),
        (
            "versions skipped / repeated",
            f"{v['versions_skipped']} / {v['versions_repeated']} ({acc['versions']:,} versions)",
        ),
        (
            "rounds merged twice; tier models conflicting / lost",
            f"{v['rounds_merged_twice']}; {v['tier_models_conflicting']} / {v['tier_models_lost']}",
        ),
        ("resume after a kill, median / max (s)", f"{median(resume):.1f} / {max(resume):.1f}"),
        ("resume after a broker restart, median / max (s)", f"{median(broker):.1f} / {max(broker):.1f}"),
        (
            "best accuracy, disturbed / undisturbed",
            f"{d['best_accuracy']:.3f} / {d['baseline']['best_accuracy']:.3f} "
            f"(band: {d['accuracy_band']['rule']}; {'within' if d['accuracy_band']['within'] else 'outside'})",
        ),
    ]
    return "\n".join(["| measure | value |", "|---|---|", *(f"| {k} | {x} |" for k, x in rows)])


def scale_table(runs: Sequence[Mapping], name: str) -> str:
    """One scale sweep: memory, round lengths, per-message cost and queue depths at each client count."""
    lines = [
        f"`{name}`:",
        "",
        "| clients | peak RSS total (MiB) | worker / evaluator / barrier / aggregator / profiler peak (MiB) "
        "| profiling (s) | mean round per tier (s) | handling per message, barrier / aggregator (ms) "
        "| deepest queues (messages) | global versions |",
        "|---:|---:|---|---:|---|---|---|---:|",
    ]
    for r in runs:
        rss = r["rss_mib_by_role"]
        peaks = " / ".join(str(rss[k]) for k in ("worker", "evaluator", "barrier", "aggregator", "profiler"))
        rounds = ", ".join(f"{r['round_seconds_by_tier'][k]:g}" for k in sorted(r["round_seconds_by_tier"], key=int))
        queues = ", ".join(f"{q.removeprefix('fedat.')} {n}" for q, n in r["deepest_queues"])
        lines.append(
            f"| {r['clients']:,} | {r['rss_total_peak_mib']:,} | {peaks} | {r['profiling_seconds']:g} | {rounds} "
            f"| {r['handle_ms']['barrier']:g} / {r['handle_ms']['aggregator']:g} | {queues} "
            f"| {r['global_updates']} |"
        )
    return "\n".join(lines)

"""What a chaos run measured, and its report: chaos.json's numbers, chaos.md's tables, and why a run failed."""

from __future__ import annotations

import argparse
import statistics
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from fedat.deploy.experiment import Experiment
from fedat.ops.capture import Records
from fedat.ops.invariants import VIOLATIONS, Verdict

ACCURACY_BAND = 0.10  # disturbed best accuracy must be >= baseline best - this
RESUME_TIMEOUT = 60.0  # after the budget: every service connected and a new global version, at most this long


@dataclass
class Outcome:
    """What happened in one run (disturbed or baseline)."""

    label: str
    vhost: str
    seconds: float
    events: list[dict[str, Any]] = field(default_factory=list)  # executed events with their measurements
    crashes: list[dict[str, Any]] = field(default_factory=list)
    seed_exit: int | None = None
    live_at_end: bool = False
    records: Records | None = None
    verdict: Verdict | None = None
    best_accuracy: float | None = None
    best_version: int | None = None
    versions: int = 0
    tier_rounds: dict[int, int] = field(default_factory=dict)
    wall_seconds: float = 0.0


def measure(out: Outcome, r: Records) -> None:
    """Best accuracy, versions, and each disruption's time to resume (see RESUME_DEFINITION)."""
    best: dict[int, float] = {}
    for e in r.evaluations:
        best[e.version] = max(best.get(e.version, 0.0), e.accuracy)
    if best:
        out.best_version = max(best, key=lambda v: (best[v], -v))
        out.best_accuracy = best[out.best_version]
    out.versions = max((g.version for g in r.globals), default=0)
    rounds: dict[int, int] = {}
    for tm in r.tier_models:
        rounds[tm.tier] = max(rounds.get(tm.tier, 0), tm.round)
    out.tier_rounds = dict(sorted(rounds.items()))
    timeline = sorted((g.created_at, g.version) for g in r.globals)
    for rec in out.events:
        t = rec["wall"]
        before = max((v for c, v in timeline if c <= t), default=-1)
        connected = rec.get("connected_wall")
        newer = None
        if connected is not None:
            newer = next((c for c, v in timeline if c > connected and v > before), None)
        rec["connected_after"] = round(connected - t, 2) if connected else None
        rec["resume_seconds"] = round(newer - t, 2) if newer else None


RESUME_DEFINITION = (
    "Time to resume: from the SIGKILL (or the start of the broker restart) until the aggregator publishes a global "
    "version (its `created_at`) that is newer than every version published before the disruption, and is "
    "published after the restarted service (after a broker restart: every service) reported "
    "`fedat_broker_connected 1` on its metrics endpoint (polled every 0.2 s). So a version already on its way "
    "when the service died does not count: the pipeline must make progress with the restarted service in it. A "
    "worker's or the evaluator's time is mostly its TensorFlow start-up; '-' means it did not happen before the "
    "run ended."
)


def _median_max(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):.1f} s / {max(values):.1f} s"


def summarize(
    args: argparse.Namespace, exp: Experiment, run: Outcome, baseline: Outcome | None, failures: list[str]
) -> dict[str, Any]:
    """The numbers of chaos.json."""
    v = run.verdict
    assert v is not None
    kills = [e for e in run.events if e["action"] == "kill"]
    restarts = [e for e in run.events if e["action"] == "broker-restart"]
    by_kind = Counter(e["target"].split("-")[0] if e["target"].startswith("worker") else e["target"] for e in kills)
    band = None
    if baseline is not None and baseline.best_accuracy is not None:
        floor = baseline.best_accuracy - ACCURACY_BAND
        band = {
            "floor": round(floor, 4),
            "rule": f"disturbed best >= baseline best - {ACCURACY_BAND}",
            "within": run.best_accuracy is not None and run.best_accuracy >= floor,
        }
    return {
        "experiment": exp.name,
        "minutes": args.minutes,
        "seed": args.seed,
        "kills_requested": args.kills,
        "broker_restarts_requested": args.broker_restarts,
        "kills": dict(sorted(by_kind.items())),
        "kills_by_service": dict(sorted(Counter(e["target"] for e in kills).items())),
        "broker_restarts": len(restarts),
        "violations": dict(v.counts),
        "examples": {k: list(x) for k, x in v.examples.items()},
        "accounted": dict(v.info),
        "versions_skipped_or_repeated": v.counts["versions_skipped"] + v.counts["versions_repeated"],
        "resume_after_kill_seconds": [e["resume_seconds"] for e in kills],
        "resume_after_broker_restart_seconds": [e["resume_seconds"] for e in restarts],
        "resume_definition": RESUME_DEFINITION,
        "events": [{k: x for k, x in e.items() if not k.endswith("_wall") and k != "wall"} for e in run.events],
        "crashes": run.crashes,
        "seed_exit": run.seed_exit,
        "live_at_end": run.live_at_end,
        "best_accuracy": run.best_accuracy,
        "best_version": run.best_version,
        "versions": run.versions,
        "tier_rounds": run.tier_rounds,
        "capture": {
            "reconnect_attempts": run.records.reconnect_attempts if run.records else None,
            "undecodable": run.records.undecodable if run.records else None,
            "queued_at_end": len(run.records.queued) if run.records else None,
            "dead_letter_reasons": dict(
                Counter(f"{d.source}: {d.reason[:60]}" for d in run.records.dead_letters) if run.records else {}
            ),
        },
        "baseline": None
        if baseline is None
        else {
            "best_accuracy": baseline.best_accuracy,
            "best_version": baseline.best_version,
            "versions": baseline.versions,
            "tier_rounds": baseline.tier_rounds,
            "violations": dict(baseline.verdict.counts) if baseline.verdict else None,
            "wall_seconds": baseline.wall_seconds,
        },
        "accuracy_band": band,
        "wall_seconds": run.wall_seconds,
        "failures": failures,
        "ok": not failures,
    }


def markdown(s: dict[str, Any]) -> str:
    """The chaos table, its definitions and the event log."""
    v = s["violations"]
    resumed_k = [x for x in s["resume_after_kill_seconds"] if x is not None]
    resumed_b = [x for x in s["resume_after_broker_restart_seconds"] if x is not None]
    kills = ", ".join(f"{k} {n}" for k, n in s["kills"].items()) or "none"
    acc = f"{s['best_accuracy']:.3f} (version {s['best_version']})" if s["best_accuracy"] is not None else "-"
    rows = [
        ("run", f"{s['experiment']}, {s['minutes']:g} min, seed {s['seed']}, {s['versions']} global versions"),
        ("kills per service", f"{kills} (total {sum(s['kills'].values())})"),
        ("broker restarts", str(s["broker_restarts"])),
        ("updates lost", str(v["updates_lost"])),
        ("updates counted twice", str(v["updates_counted_twice"])),
        ("updates dead-lettered by the broker", str(v["updates_dead_lettered_by_broker"])),
        ("versions skipped / repeated", f"{v['versions_skipped']} / {v['versions_repeated']}"),
        ("rounds merged twice", str(v["rounds_merged_twice"])),
        ("tier models conflicting / lost", f"{v['tier_models_conflicting']} / {v['tier_models_lost']}"),
        (
            "time to resume after a kill, median / max",
            f"{_median_max(resumed_k)} ({len(resumed_k)} of {len(s['resume_after_kill_seconds'])} resumed)",
        ),
        (
            "time to resume after a broker restart, median / max",
            f"{_median_max(resumed_b)} ({len(resumed_b)} of {len(s['resume_after_broker_restart_seconds'])} resumed)",
        ),
        ("services that crashed on their own", str(len(s["crashes"]))),
        ("pipeline live at the end", "yes" if s["live_at_end"] else "NO"),
        ("best accuracy, disturbed", acc),
    ]
    if s["baseline"] is not None:
        b = s["baseline"]
        band = s["accuracy_band"]
        rows.append(("best accuracy, undisturbed baseline", f"{b['best_accuracy']:.3f}" if b["best_accuracy"] else "-"))
        if band is not None:
            rows.append((f"within the band ({band['rule']})", "yes" if band["within"] else "NO"))
    lines = ["| measure | value |", "|---|---|", *(f"| {a} | {b} |" for a, b in rows), ""]
    lines.append(s["resume_definition"])
    lines.append("")
    if s["baseline"] is not None:
        lines.append(
            f"Accuracy band: the disturbed run's best must be at least the baseline's best minus {ACCURACY_BAND}. "
            "Best-of-run, not a final point: on this 2-classes-per-client split single evaluations swing by "
            "0.1-0.25 between versions. The margin allows for the training time the disruptions cost (each kill of "
            "the barrier or aggregator halts merging until it is back) and for two runs of the same seed not seeing "
            "the same rounds (asynchronous timing); a larger gap means the disruptions damaged the model, e.g. a "
            "restarted aggregator that started again from the seed model."
        )
        lines.append("")
    lines.append(f"Invariants (fedat.ops.invariants): {', '.join(VIOLATIONS)}. Accounted for: {s['accounted']}")
    lines.append("")
    if s["failures"]:
        lines += ["**Failures:**", *(f"- {f}" for f in s["failures"]), ""]
    for k, ex in s["examples"].items():
        lines.append(f"- {k}: " + "; ".join(ex[:5]))
    lines += ["", "| t (s) | event | target | phase | pause (s) | connected after (s) | resumed after (s) |"]
    lines.append("|---|---|---|---|---|---|---|")
    for e in s["events"]:
        lines.append(
            f"| {e['time']} | {e['action']} | {e['target']} | {e['phase']} | {e['pause']} | "
            f"{_s(e.get('connected_after'))} | {_s(e.get('resume_seconds'))} |"
        )
    return "\n".join(lines) + "\n"


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def failures_of(run: Outcome) -> list[str]:
    """Why the chaos run fails: violated invariants, a stalled pipeline, services crashing on their own."""
    out = []
    assert run.verdict is not None
    for k, n in run.verdict.violated().items():
        out.append(f"{k}: {n}")
    if not run.live_at_end:
        out.append(f"the pipeline did not resume within {RESUME_TIMEOUT:.0f}s after the last disruption")
    for e in run.events:
        if e.get("resume_seconds") is None:
            out.append(f"no resume after {e['action']} of {e['target']} at {e['time']}s")
        if e.get("error"):
            out.append(f"broker restart at {e['time']}s failed: {e['error']}")
    if run.crashes:
        out.append(f"services exited on their own: {run.crashes}")
    if run.seed_exit not in (0, None):
        out.append(f"the seed job exited with {run.seed_exit}")
    return out

"""Multi-seed sweeps: one small record file per finished run, and the tables rebuilt from those files alone.

A long sweep (`fedat compare --simulate`) writes `<summaries>/<comparison>/<method>/seed-<s>.json` as each run
finishes and skips the runs whose file exists, so it can be stopped and finished over several days; the records are
small (headline numbers and the evaluation curve, no events) and are committed. `fedat tabulate --sweeps DIR`
rebuilds the tables from them (and `fedat.lab.report` the whole results report).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from fedat.lab.compare import MethodResult, first_reaching, quarter_rise, tail_mean

SCHEMA = 1
# Why the paired table counts CPU kinds: two kinds of processor run the same event schedule (the simulation is
# deterministic) but round the CNN's arithmetic differently, so a pair across kinds also differs by that noise.
CPU_NOTE = (
    "A pair on two kinds of processor, or one whose record does not name its processor, had the same schedule but "
    "not the same floating-point arithmetic: its difference also holds that noise (0.023 at most so far in the "
    "CNN's accuracy)."
)
PAIRED_HEAD = "seeds paired with"
BAND_WINDOW = 150.0  # s of trailing mean in a sweep plot: about five evaluations, enough to read the trend
# summary.json fields a record keeps: enough for every table, small enough to commit
KEPT = (
    "best_accuracy",
    "best_version",
    "final_accuracy",
    "best_accuracy_variance",
    "global_updates",
    "tier_rounds",
    "bytes_up",
    "bytes_down",
    "client_updates",
    "client_trainings",
    "profile_trainings",
    "late_fraction",
    "evaluations",
    "failure",
    "wall_seconds",
    "cpu_seconds",
    "virtual_seconds",
    "events_run",
)


def record_path(root: Path, comparison: str, method: str, seed: int) -> Path:
    """Where the record of one (comparison, method, seed) run lives."""
    return root / comparison / method / f"seed-{seed}.json"


def cpu_name(cpuinfo: str) -> str:
    """The processor as /proc/cpuinfo names it, with its widest vector unit: TensorFlow picks kernels by it."""
    fields = dict((k.strip(), v.strip()) for k, _, v in (line.partition(":") for line in cpuinfo.splitlines()) if v)
    flags = set(fields.get("flags", "").split())
    simd = next((f for f in ("avx512f", "avx2", "avx", "sse4_2") if f in flags), "none")
    return f"{fields.get('model name', 'unknown')} ({simd})"


def this_cpu() -> str:
    """This machine's processor, as `cpu_name` names it."""
    info = Path("/proc/cpuinfo")
    return cpu_name(info.read_text()) if info.exists() else "unknown"


def make_record(run_dir: Path, comparison: str, method: str, order: int = 0, targets: Sequence[float] = ()) -> dict:
    """The small record of a finished run folder: settings, headline numbers, curve, mean tier weights.

    `order` is the method's place in its comparison file (tables keep it), `targets` the comparison's accuracies.
    `at_eval` holds, for each evaluation, what the tables need at that instant (variance, evaluated version, rounds
    per tier, Σ tier weights and global versions so far), so that `truncated` gives any shorter budget's record:
    a simulation is deterministic, so the first M minutes of a longer run are the M-minute run. `cpu` names the
    processor it ran on: the event schedule is the same everywhere, the trained numbers only on the same kind.
    """
    summary = json.loads((run_dir / "summary.json").read_text())
    experiment = json.loads((run_dir / "experiment.json").read_text())
    curve: list[list] = []
    at_eval: list[list] = []
    counts: list[int] = []
    wsum: list[float] = []
    globals_ = 0
    for line in (run_dir / "events.jsonl").read_text().splitlines():
        e = json.loads(line)
        if e["event"] == "evaluation":
            curve.append([e["time"], round(e["accuracy"], 5), e["bytes_up"], e["bytes_down"]])
            at_eval.append([e.get("variance"), e["version"], list(counts), [round(w, 4) for w in wsum], globals_])
        elif e["event"] == "global":
            counts = list(e.get("tier_counts") or counts)
            if e.get("tier_weights"):
                ws = e["tier_weights"]
                wsum = [a + b for a, b in zip(wsum, ws, strict=True)] if wsum else list(ws)
                globals_ += 1
    return {
        "schema": SCHEMA,
        "comparison": comparison,
        "method": method,
        "order": order,
        "targets": list(targets),
        "seed": int(summary.get("seed", experiment["settings"].get("seed", 0))),
        "virtual_minutes": experiment.get("simulated", {}).get("virtual_minutes", experiment.get("minutes")),
        "settings": experiment["settings"],
        "cpu": this_cpu(),
        "summary": {k: summary.get(k) for k in KEPT},
        "mean_tier_weights": [round(w / globals_, 4) for w in wsum] if globals_ else [],
        "curve": curve,
        "at_eval": at_eval,
    }


def truncated(rec: dict, minutes: float) -> dict:
    """The record of the first `minutes` of a longer run (headline numbers as of its last evaluation by then)."""
    if minutes > rec["virtual_minutes"] + 1e-9:
        raise ValueError(f"{rec['method']} seed {rec['seed']}: ran {rec['virtual_minutes']:g} min, not {minutes:g}")
    if abs(minutes - rec["virtual_minutes"]) < 1e-9:
        return rec
    k = sum(1 for p in rec["curve"] if p[0] <= minutes * 60.0)
    curve, at = rec["curve"][:k], rec["at_eval"][:k]
    summary = {**rec["summary"], "client_updates": None, "client_trainings": None, "profile_trainings": None}
    mean_weights: list[float] = []
    if k:
        best = max(range(k), key=lambda i: curve[i][1])
        rounds, wsum, n = at[k - 1][2:]
        summary.update(
            best_accuracy=curve[best][1],
            best_version=at[best][1],
            best_accuracy_variance=at[best][0],
            final_accuracy=curve[-1][1],
            tier_rounds=rounds,
            bytes_up=curve[-1][2],
            bytes_down=curve[-1][3],
            global_updates=n,
            evaluations=k,
            virtual_seconds=minutes * 60.0,
        )
        mean_weights = [round(w / n, 4) for w in wsum] if n else []
    return {
        **rec,
        "virtual_minutes": minutes,
        "truncated_from": rec["virtual_minutes"],
        "summary": summary,
        "mean_tier_weights": mean_weights,
        "curve": curve,
        "at_eval": at,
    }


def _canonical(settings: Mapping) -> str:
    # JSON's view, as experiment.json stored it: key order does not matter, a tuple is a list
    return json.dumps(settings, sort_keys=True)


def same_run(root: Path, settings: Mapping, minutes: float) -> dict | None:
    """A record, of any comparison, of a run with exactly these settings (seed included) that ran >= `minutes`.

    A simulation is a function of its settings and seed, so another comparison's run of the same settings is this
    run: a participation sweep's k = 10 is the main comparison's FedAT. The longest such record is returned.
    """
    want = _canonical(settings)
    best = None
    for path in sorted(root.glob("*/*/seed-*.json")):
        rec = json.loads(path.read_text())
        if rec.get("schema") != SCHEMA or rec.get("reused_from") or float(rec["virtual_minutes"]) < minutes - 1e-9:
            continue
        if _canonical(rec["settings"]) == want and (best is None or rec["virtual_minutes"] > best["virtual_minutes"]):
            best = rec
    return best


def reused(rec: dict, comparison: str, method: str, order: int, targets: Sequence[float]) -> dict:
    """`rec` filed as (comparison, method): same run, new place; `reused_from` names the original."""
    origin = f"{rec['comparison']}/{rec['method']}/seed-{rec['seed']}"
    return {
        **rec,
        "comparison": comparison,
        "method": method,
        "order": order,
        "targets": list(targets),
        "reused_from": origin,
    }


def load_records(root: Path) -> dict[str, dict[str, list[dict]]]:
    """Every record under `root`, as comparison → method → records sorted by seed (file order of methods kept)."""
    out: dict[str, dict[str, list[dict]]] = {}
    for path in sorted(root.glob("*/*/seed-*.json")):
        rec = json.loads(path.read_text())
        if rec.get("schema") != SCHEMA:
            raise ValueError(f"{path}: record schema {rec.get('schema')!r}, expected {SCHEMA}")
        out.setdefault(rec["comparison"], {}).setdefault(rec["method"], []).append(rec)
    for comparison, methods in out.items():
        for recs in methods.values():
            recs.sort(key=lambda r: r["seed"])
        out[comparison] = dict(sorted(methods.items(), key=lambda kv: (kv[1][0].get("order", 0), kv[0])))
    return out


def mean_std(xs: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value)."""
    n = len(xs)
    m = sum(xs) / n
    return m, (sum((x - m) ** 2 for x in xs) / (n - 1)) ** 0.5 if n > 1 else 0.0


def pm(xs: Sequence[float], fmt: str = ".3f") -> str:
    """Mean ± sample standard deviation in `fmt` (the value alone for one, "—" for none)."""
    if not xs:
        return "—"
    m, s = mean_std(xs)
    return f"{m:{fmt}} ± {s:{fmt.lstrip('+')}}" if len(xs) > 1 else f"{m:{fmt}}"


def seed_band(
    records: Sequence[dict], step: float = 30.0, window: float = BAND_WINDOW
) -> tuple[list[float], list[float], list[float], list[float], list[int]]:
    """Accuracy of several seeds on one time grid: (times, mean, min, max, seeds) per grid point.

    Each seed's curve is held (the last evaluation at or before t counts, as a deployed model would) and averaged
    over its trailing `window` seconds; a grid point counts only the seeds whose run reached it."""
    end = max(r["virtual_minutes"] * 60.0 for r in records)
    grid = [i * step for i in range(int(end / step + 1e-9) + 1)]
    span = max(1, int(window / step))
    per_seed = []
    for rec in records:
        curve, held, k = rec["curve"], [], 0
        for t in grid:
            while k + 1 < len(curve) and curve[k + 1][0] <= t:
                k += 1
            held.append(curve[k][1] if curve and curve[0][0] <= t else None)
        smooth = []
        for i, t in enumerate(grid):
            xs = [x for x in held[max(0, i - span + 1) : i + 1] if x is not None]
            reached = t <= rec["virtual_minutes"] * 60.0 + 1e-9
            smooth.append(sum(xs) / len(xs) if xs and reached else None)
        per_seed.append(smooth)
    times, mean, lo, hi, n = [], [], [], [], []
    for i, t in enumerate(grid):
        xs = [s[i] for s in per_seed if s[i] is not None]
        if xs:
            times.append(t)
            mean.append(sum(xs) / len(xs))
            lo.append(min(xs))
            hi.append(max(xs))
            n.append(len(xs))
    return times, mean, lo, hi, n


def coverage(records: Sequence[dict]) -> str:
    """How far a method's seeds ran, for a legend: "3 seeds, 60 min" or "3 seeds to 16.5 min, 1 to 60"."""
    budgets = sorted({r["virtual_minutes"] for r in records})
    reach = [(sum(1 for r in records if r["virtual_minutes"] >= b - 1e-9), b) for b in budgets]
    (n0, b0), rest = reach[0], reach[1:]
    noun = "seed" if n0 == 1 else "seeds"
    if not rest:
        return f"{n0} {noun}, {b0:g} min"
    return f"{n0} {noun} to {b0:g} min, " + ", ".join(f"{n} to {b:g}" for n, b in rest)


def results_of(recs: Sequence[dict]) -> list[MethodResult]:
    """Records as the comparison tables' MethodResults."""
    return [MethodResult(r["method"], r["summary"], [tuple(p) for p in r["curve"]]) for r in recs]


def seed_accuracy_table(methods: Mapping[str, Sequence[dict]], reference: str = "fedat") -> str:
    """Table 1 over seeds: best and last-quarter accuracy (mean ± std), variance normalised to the reference's."""
    ref = methods.get(reference, ())
    ref_vars = [r["summary"]["best_accuracy_variance"] for r in ref if r["summary"].get("best_accuracy_variance")]
    ref_var = mean_std(ref_vars)[0] if ref_vars else None
    lines = [
        "| method | seeds | best accuracy | last-quarter mean | last-quarter rise | norm. variance "
        "| rounds per tier (mean) | tier weights (mean) "
        "| compute (min, all seeds; CPU, or wall if not recorded; a cut run pro rata) |",
        "|---|---:|---:|---:|---:|---:|---|---|---:|",
    ]
    for method, recs in methods.items():
        best = [r["summary"]["best_accuracy"] for r in recs if r["summary"].get("best_accuracy") is not None]
        tails = [t for r in recs if (t := _tail(r)) is not None]
        rises = [x for r in recs if (x := quarter_rise([tuple(p) for p in r["curve"]], _end(r))) is not None]
        var = [r["summary"]["best_accuracy_variance"] for r in recs if r["summary"].get("best_accuracy_variance")]
        norm = pm([v / ref_var for v in var], ".2f") if ref_var else "—"
        rounds = [r["summary"]["tier_rounds"] for r in recs if r["summary"].get("tier_rounds")]
        mean_rounds = [round(sum(col) / len(rounds)) for col in zip(*rounds, strict=True)] if rounds else []
        weights = [r["mean_tier_weights"] for r in recs if r.get("mean_tier_weights")]
        mean_w = [round(sum(col) / len(weights), 2) for col in zip(*weights, strict=True)] if weights else []
        # CPU time where the run recorded it; older records have only wall time (inflated on a shared machine). A
        # reused run cost nothing here: its compute is counted where it ran.
        compute = sum(cost(r) for r in recs if not r.get("reused_from")) / 60
        seeds = ",".join(f"{r['seed']}*" if r.get("reused_from") else str(r["seed"]) for r in recs)
        lines.append(
            f"| {method} | {seeds} | {pm(best)} | {pm(tails)} | {pm(rises, '+.3f')} | {norm} | {mean_rounds} "
            f"| {mean_w} | {compute:.0f} |"
        )
    origins = [
        f"{r['method']} seed {r['seed']} is {r['reused_from']}"
        for rs in methods.values()
        for r in rs
        if r.get("reused_from")
    ]
    if origins:
        lines += ["", "\\* the same settings and seed ran in another comparison: " + "; ".join(origins) + "."]
    return "\n".join(lines)


def cost(rec: dict) -> float:
    """The run's CPU seconds (wall if not recorded); a record cut from a longer run gets its share by virtual time."""
    whole = rec["summary"].get("cpu_seconds") or rec["summary"].get("wall_seconds") or 0.0
    # The summary's times are the whole run's, so a 45-minute cut of a 108-minute run would claim all of it.
    return whole * rec["virtual_minutes"] / rec.get("truncated_from", rec["virtual_minutes"])


def _end(rec: dict) -> float:
    return rec["virtual_minutes"] * 60.0


def _tail(rec: dict) -> float | None:
    return tail_mean([tuple(p) for p in rec["curve"]], _end(rec))


def paired_table(methods: Mapping[str, Sequence[dict]], reference: str) -> str:
    """Each method minus `reference` on the same seed (same data, clients and latencies; for FedAT's variants the
    same tier schedule too), so that seed-to-seed spread cancels: best and last-quarter mean, and wins per seed."""
    ref = {r["seed"]: r for r in methods.get(reference, ())}
    lines = [
        f"| method | {PAIRED_HEAD} {reference} | Δ best accuracy | Δ last-quarter mean "
        "| seeds won (last quarter) | pairs on one CPU kind |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for method, recs in methods.items():
        if method == reference:
            continue
        # (record, its reference, last-quarter difference) for every seed both ran and both evaluated late enough
        pairs = [
            (a, b, ta - tb)
            for a in recs
            if (b := ref.get(a["seed"])) is not None and (ta := _tail(a)) is not None and (tb := _tail(b)) is not None
        ]
        if not pairs:
            continue
        d_best = [a["summary"]["best_accuracy"] - b["summary"]["best_accuracy"] for a, b, _ in pairs]
        d_tail = [d for _, _, d in pairs]
        seeds = ",".join(str(a["seed"]) for a, _, _ in pairs)
        won = sum(d > 0 for d in d_tail)
        same = sum(same_cpu(a, b) for a, b, _ in pairs)
        lines.append(
            f"| {method} | {seeds} | {pm(d_best, '+.3f')} | {pm(d_tail, '+.3f')} | {won}/{len(pairs)} "
            f"| {same}/{len(pairs)} |"
        )
    return "\n".join(lines)


def same_cpu(a: dict, b: dict) -> bool:
    """Whether two records are known to have run on the same kind of processor (older records do not say)."""
    return bool(a.get("cpu")) and a.get("cpu") == b.get("cpu")


def seed_traffic_table(methods: Mapping[str, Sequence[dict]], targets: Sequence[float]) -> str:
    """Table 2 over seeds: MB (up + down) and virtual seconds to each target, mean ± std over the seeds reaching it."""
    head = "| method | " + " | ".join(f"MB to {t:.2f} | s to {t:.2f}" for t in targets) + " |"
    lines = [head, "|---|" + "---:|---:|" * len(targets)]
    for method, recs in methods.items():
        cells = []
        for t in targets:
            hits = [h for r in recs if (h := first_reaching([tuple(p) for p in r["curve"]], t)) is not None]
            reached = f" ({len(hits)}/{len(recs)})" if len(hits) < len(recs) else ""
            cells += [pm([h[1] / 1e6 for h in hits], ".0f") + reached, pm([h[0] for h in hits], ".0f")]
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def at_budget(methods: Mapping[str, Sequence[dict]], minutes: float | None) -> tuple[float, dict[str, list[dict]]]:
    """Every record cut to `minutes` (default: the shortest record's budget); records that ran less are left out."""
    budget = minutes if minutes is not None else min(r["virtual_minutes"] for rs in methods.values() for r in rs)
    out = {m: [truncated(r, budget) for r in rs if r["virtual_minutes"] >= budget - 1e-9] for m, rs in methods.items()}
    return budget, {m: rs for m, rs in out.items() if rs}


def render(
    records: Mapping[str, Mapping[str, Sequence[dict]]],
    only: str | None = None,
    minutes: float | None = None,
    planned: Mapping[str, float] | None = None,
) -> str:
    """Markdown tables of every comparison in `records` (or just `only`), as `render_comparison` makes them, with the
    note on processors once at the end."""
    parts = [
        render_comparison(comparison, every, (planned or {}).get(comparison), minutes, note=False)
        for comparison, every in records.items()
        if only is None or comparison == only
    ]
    parts = [p for p in parts if p]
    # once at the end: it explains every paired table
    return "\n\n".join(parts + ([CPU_NOTE] if any(PAIRED_HEAD in p for p in parts) else []))


def render_comparison(
    comparison: str,
    every: Mapping[str, Sequence[dict]],
    plan: float | None = None,
    minutes: float | None = None,
    note: bool = True,
) -> str:
    """A comparison's tables: at `minutes`, or else at every budget its records ran and at its planned budget `plan`
    (longest first; each table holds the records that reach it, and a budget only reused runs reach has none), with
    the comparison's targets; the note on processors closes them if any table pairs methods."""
    parts = []
    # the budgets of the comparison's own runs: a longer run reused from another comparison is in that one's table
    own = {r["virtual_minutes"] for rs in every.values() for r in rs if not r.get("reused_from")}
    # the comparison file's budget stays a table once every run has gone on past it
    if plan is not None and any(b >= plan for b in own):
        own.add(plan)
    paired = False
    for b in [minutes] if minutes is not None else sorted(own)[::-1]:
        budget, methods = at_budget(every, b)
        if not methods:
            continue
        first = next(iter(methods.values()))[0]
        reference = "fedat" if "fedat" in methods else next(iter(methods))
        ts = first.get("targets") or (0.70, 0.79, 0.85)
        parts += [
            f"### {comparison} ({budget:g} virtual min per run)",
            seed_accuracy_table(methods, reference),
            seed_traffic_table(methods, ts),
        ]
        if len(methods) > 1:
            parts.append(paired_table(methods, reference))
            paired = True
    if paired and note:
        parts.append(CPU_NOTE)  # once at the end: it explains every paired table
    return "\n\n".join(parts)


def pending(
    methods: Sequence[str], seeds: Sequence[int], single_seed: Sequence[str], done: set[tuple[str, int]]
) -> list[tuple[str, int]]:
    """The (method, seed) runs still to do, seed-major so that every method gets its first seed before any second."""
    todo = []
    for seed in seeds:
        for method in methods:
            if (method in single_seed and seed != seeds[0]) or (method, seed) in done:
                continue
            todo.append((method, seed))
    return todo

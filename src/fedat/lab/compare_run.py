"""`fedat compare`: run several methods one after another with the same data, seed and budget, then tabulate."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from fedat.deploy.experiment import Experiment, check_settings, load_experiment
from fedat.lab.compare import MethodResult, accuracy_table, traffic_table
from fedat.lab.run import run


def load_comparison(path: Path) -> tuple[str, float, list[float], list[Experiment]]:
    """A comparison file: a base experiment plus per-method setting overrides."""
    raw = yaml.safe_load(path.read_text())
    if not isinstance(raw, dict) or not isinstance(raw.get("methods"), dict) or "base" not in raw:
        raise ValueError(f"{path}: expected 'name', 'base' (an experiment file), 'targets' and a 'methods' map")
    base = load_experiment(path.parent / raw["base"])
    name = str(raw.get("name", path.stem))
    minutes = float(raw.get("minutes", base.minutes))
    exps = [
        Experiment(
            f"{name}-{method}",
            int(raw.get("workers", base.workers)),
            minutes,
            {**base.settings, **check_settings(overrides or {}, f"{path}: method {method}")},
        )
        for method, overrides in raw["methods"].items()
    ]
    return name, minutes, [float(t) for t in raw.get("targets", [0.5])], exps


@dataclass(frozen=True)
class SimulationPlan:
    """A comparison file's `simulate:` section: virtual minutes per run, seeds, the methods run on one seed, the
    methods that run longer or shorter than the rest (a curve that needs longer to flatten, say), and the methods the
    sweep runs (empty: every method of the file)."""

    virtual_minutes: float
    seeds: tuple[int, ...]
    single_seed: tuple[str, ...] = ()
    method_minutes: Mapping[str, float] = field(default_factory=dict)
    methods: tuple[str, ...] = ()

    def minutes_for(self, method: str) -> float:
        """The virtual minutes a run of `method` gets."""
        return self.method_minutes.get(method, self.virtual_minutes)

    def swept(self, method: str) -> bool:
        """Whether the sweep runs `method` when no method is named on the command line."""
        return not self.methods or method in self.methods


SIMULATE_KEYS = ("virtual_minutes", "seeds", "single_seed", "method_minutes", "methods")


def simulation_plan(path: Path) -> SimulationPlan:
    """The `simulate:` section of a comparison file (default: its minutes, its seed, every method)."""
    raw = yaml.safe_load(path.read_text())
    sim = raw.get("simulate") or {}
    unknown = sorted(set(sim) - set(SIMULATE_KEYS))
    if unknown:
        raise ValueError(f"{path}: unknown key(s) {unknown} in 'simulate' ({', '.join(SIMULATE_KEYS)})")
    _, minutes, _, exps = load_comparison(path)
    methods = [e.name.removeprefix(f"{raw.get('name', path.stem)}-") for e in exps]
    single = tuple(str(m) for m in sim.get("single_seed", ()))
    if set(single) - set(methods):
        raise ValueError(f"{path}: simulate.single_seed names unknown method(s) {sorted(set(single) - set(methods))}")
    swept = tuple(str(m) for m in sim.get("methods") or ())
    if set(swept) - set(methods):
        raise ValueError(f"{path}: simulate.methods names unknown method(s) {sorted(set(swept) - set(methods))}")
    longer = sim.get("method_minutes") or {}
    if not isinstance(longer, dict) or set(longer) - set(methods):
        raise ValueError(f"{path}: simulate.method_minutes must map known methods to minutes, not {longer!r}")
    bad = {m: v for m, v in longer.items() if isinstance(v, bool) or not isinstance(v, int | float) or v <= 0}
    if bad:
        raise ValueError(f"{path}: simulate.method_minutes: minutes must be positive numbers, not {bad}")
    seeds = tuple(int(s) for s in sim.get("seeds", [exps[0].settings.get("seed", 0)]))
    per_method = {str(m): float(v) for m, v in longer.items()}
    return SimulationPlan(float(sim.get("virtual_minutes", minutes)), seeds, single, per_method, swept)


def planned_minutes(
    experiments: Path, records: Mapping[str, Iterable[str]]
) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """The virtual minutes the comparison files in `experiments` set for `records` (comparison → its methods): each
    comparison's budget, and each method's own (comparison → method → minutes); a comparison without a file has
    neither."""
    plans = {c: simulation_plan(f) for c in records if (f := experiments / f"{c}.yaml").is_file()}
    budgets = {c: plan.virtual_minutes for c, plan in plans.items()}
    return budgets, {c: {m: plan.minutes_for(m) for m in records[c]} for c, plan in plans.items()}


def curve(run_dir: Path) -> list[tuple[float, float, int, int]]:
    """(time, accuracy, bytes up, bytes down) of every evaluation of a run."""
    events = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    return [(e["time"], e["accuracy"], e["bytes_up"], e["bytes_down"]) for e in events if e["event"] == "evaluation"]


def compare(path: Path, results: Path, minutes: float | None = None) -> str:
    """Run every method of the comparison file; write compare.md, compare.json and the plots; return the Markdown."""
    name, budget, targets, exps = load_comparison(path)
    budget = budget if minutes is None else minutes
    out = results / f"{time.strftime('%Y%m%d-%H%M%S')}-{name}"
    out.mkdir(parents=True)
    done: list[MethodResult] = []
    for exp in exps:
        method = exp.name.removeprefix(f"{name}-")
        print(f"[fedat compare] {method}: {budget:g} min", flush=True)
        summary = run(exp, out, budget, tag=method)
        done.append(MethodResult(method, summary, curve(Path(summary["run_dir"]))))
    seed = exps[0].settings.get("seed", 0)
    methods = {r.name: {"summary": r.summary, "curve": r.curve} for r in done}
    meta = {"name": name, "minutes": budget, "targets": targets, "seed": seed}
    (out / "compare.json").write_text(json.dumps({**meta, "methods": methods}, indent=2))
    md = report(out, name, budget, targets, seed, done)
    print(md, flush=True)
    return md


def tabulate(out: Path) -> str:
    """Rewrite compare.md and the plots of a finished comparison from its compare.json alone (e.g. new columns)."""
    raw = json.loads((out / "compare.json").read_text())
    done = [MethodResult(m, r["summary"], [tuple(p) for p in r["curve"]]) for m, r in raw["methods"].items()]
    return report(out, raw["name"], raw["minutes"], raw["targets"], raw["seed"], done)


def report(out: Path, name: str, budget: float, targets: list[float], seed: int, done: list[MethodResult]) -> str:
    """Write compare.md and the plots; return the Markdown."""
    reference = "fedat" if any(r.name == "fedat" for r in done) else done[0].name
    md = "\n\n".join(
        [
            f"# {name}: {len(done)} methods, {budget:g} min each, seed {seed}",
            "## Accuracy and per-client variance (the paper's Table 1)",
            accuracy_table(done, budget * 60, reference),
            "## Traffic and time to target accuracy (the paper's Table 2)",
            traffic_table(done, targets, reference),
            "## Rounds per tier",
            "\n".join(f"- {r.name}: {r.summary.get('tier_rounds')}" for r in done),
        ]
    )
    (out / "compare.md").write_text(md + "\n")
    try:
        from fedat.lab.plots import plot_comparison

        plot_comparison(out, done)
    except ImportError:
        pass
    return md

"""Every shipped experiment runs under the simulator: each single experiment and each method of each comparison
file, with the numpy stand-in trainer (`fedat_sim.fakes`), for a short virtual time. The stand-in ignores the
learning rate, so of the experiments whose settings differ only in it (or not at all) one runs.

The virtual time is what the experiment's own latency model needs for a trained model to be made and scored: the
profiling pass (ceil(clients / profile_concurrency) waves of the slowest modelled profiling answer), one round of
the slowest modelled client, and one evaluation interval (or `eval_every` rounds); at least 10 s. Every term is an
upper bound from `fedat.fl.latency` (largest device factor, largest delay), so the experiments with fast rounds (smoke,
chaos: a round every ~0.1-2 s) simulate seconds, not minutes, and the whole file stays fast; FMNIST #2 with time
scale 3 (compare-fmnist2-fast-tier) simulates ~3.5 minutes because its slowest client answers only after ~100 s.

The stand-in clients get the experiment's sample count (`samples_per_client`, else an even split of Fashion-MNIST's
60,000), so that the nominal training time, and hence the schedule, is the experiment's.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from fedat.deploy.experiment import Experiment, load_experiment
from fedat.lab.compare_run import load_comparison
from fedat_sim import fakes
from fedat_sim.simulate import simulate

ROOT = Path(__file__).resolve().parents[2]


def shipped() -> list[Experiment]:
    """experiments/*.yaml: the single experiments, and every method of every comparison (a `base:` and `methods:`)."""
    out: list[Experiment] = []
    for path in sorted((ROOT / "experiments").glob("*.yaml")):
        if path.stem.startswith("compare-"):
            out.extend(load_comparison(path)[3])
        else:
            out.append(load_experiment(path))
    return out


EXPERIMENTS = shipped()


def one_per_schedule(exps: list[Experiment]) -> list[Experiment]:
    """The first of the experiments whose settings differ only in the learning rate, which the stand-in ignores."""
    seen: set[str] = set()
    out = []
    for exp in exps:
        key = json.dumps({k: v for k, v in exp.settings.items() if k != "learning_rate"}, sort_keys=True, default=str)
        if key not in seen:
            seen.add(key)
            out.append(exp)
    return out


SCHEDULES = one_per_schedule(EXPERIMENTS)


def samples(exp: Experiment) -> int:
    """Training samples per stand-in client."""
    return int(exp.settings.get("samples_per_client") or 60_000 // int(exp.settings.get("num_clients", 100)))


def eval_settings(exp: Experiment) -> tuple[int, float]:
    """(every, interval) as the evaluator reads them (defaults 5 and 0)."""
    return int(exp.settings.get("eval_every", 5)), float(exp.settings.get("eval_interval", 0.0))


def virtual_seconds(exp: Experiment) -> float:
    """Long enough for the profiling pass, one round and one evaluation of the result (upper bounds)."""
    s = exp.settings
    step = float(s.get("step_seconds") or fakes.STEP_SECONDS)  # without step_seconds: the stand-in's measured time
    factor, delay = max(s.get("device_factor", [1.0])), max(s.get("delays", [30.0]))
    batches = math.ceil(samples(exp) / int(s.get("batch_size", 10)))

    def slowest(epochs: int) -> float:
        return (epochs * batches * step * factor + delay) * float(s.get("time_scale", 0.1))

    waves = math.ceil(int(s.get("num_clients", 100)) / int(s.get("profile_concurrency", 32)))
    every, interval = eval_settings(exp)
    one_round = slowest(int(s.get("epochs", 3)))
    return max(10.0, waves * slowest(int(s.get("profile_epochs", 1))) + one_round + interval + every * one_round)


@pytest.fixture
def no_plots(monkeypatch):
    """Skip the PNGs (matplotlib is most of a short simulation's time; test_sim_simulate checks they are written)."""
    import fedat.lab.plots

    monkeypatch.setattr(fedat.lab.plots, "plot_run", lambda folder: None)


def test_every_experiment_file_and_every_comparison_method_is_listed():
    names = {e.name for e in EXPERIMENTS}
    files = sorted((ROOT / "experiments").glob("*.yaml"))
    singles = [p for p in files if not p.stem.startswith("compare-")]
    comparisons = [load_comparison(p) for p in files if p.stem.startswith("compare-")]
    assert len(EXPERIMENTS) == len(names) == len(singles) + sum(len(c[3]) for c in comparisons)
    assert {"smoke", "compare-smoke-fedat", "compare-smoke-fedavg"} <= names


# A simulation whose clock stops advancing (rounds that close at one virtual instant, forever) must fail, not hang.
# A guard against hanging only, not a speed target: the 500-client tier-size runs took 45-60 s on a slow machine
# shared with two sweeps, so 60 s failed there; speed lives in `make bench`.
@pytest.mark.timeout(600)
@pytest.mark.parametrize("exp", SCHEDULES, ids=[e.name for e in SCHEDULES])
def test_the_experiment_runs_under_the_simulator(exp: Experiment, tmp_path, no_plots):
    seconds = virtual_seconds(exp)
    n = int(exp.settings.get("num_clients", 100))
    summary = simulate(exp, tmp_path, seconds / 60, parts=fakes.fake_parts(n, samples(exp)), tag="sim")
    events = [json.loads(x) for x in (tmp_path / "sim" / "events.jsonl").read_text().splitlines()]
    brief = {k: summary[k] for k in ("tier_rounds", "global_updates", "evaluations", "crashes", "handler_errors")}
    where = f"{exp.name}, {seconds:.0f} virtual s: {brief}"
    assert summary["failure"] is None, where
    assert summary["crashes"] == 0 and summary["handler_errors"] == 0, where
    assert len(summary["tier_rounds"]) == int(exp.settings.get("num_tiers", 5)), where
    assert sum(summary["tier_rounds"]) > 0 and summary["global_updates"] > 0, where
    assert summary["client_trainings"] >= summary["client_updates"] > 0, where
    merged = [e for e in events if e["event"] == "global" and e["version"] >= 1]
    assert len(merged) == summary["global_updates"], where  # the recorder saw every version
    every, interval = eval_settings(exp)
    if every > 0 or interval > 0:
        scored = [e for e in events if e["event"] == "evaluation" and e["version"] >= 1]
        assert scored and 0.0 <= scored[-1]["accuracy"] <= 1.0, f"no trained model was evaluated: {where}"

"""`fedat_sim.simulate` writes the results folder of `fedat run`, in virtual time, the same for the same seed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fedat.deploy.experiment import Experiment, load_experiment
from fedat_sim import simulate
from fedat_sim.fakes import fake_parts
from fedat_sim.simulate import STOP_GRAIN

FMNIST = Path("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz")

SMALL = {
    "strategy": "fedat",
    "num_clients": 8,
    "num_tiers": 2,
    "clients_per_round": 3,
    "min_clients": 2,
    "epochs": 1,
    "batch_size": 10,
    "codec": "polyline",
    "precision": 4,
    "time_scale": 1.0,
    "delays": [0, 1, 5, 10],
    "device_factor": [1, 2],
    "step_seconds": 0.2,
    "eval_every": 0,
    "eval_interval": 15,
    "profile_concurrency": 8,
    "min_deadline": 3,
    "seed": 0,
}


def events(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]


def test_a_simulation_writes_the_results_folder_of_fedat_run(tmp_path):
    summary = simulate(Experiment("tiny", 2, 1, dict(SMALL)), tmp_path, 3, parts=fake_parts(8), tag="a")
    run = tmp_path / "a"
    assert {"experiment.json", "events.jsonl", "summary.json"} <= {p.name for p in run.iterdir()}
    meta = json.loads((run / "experiment.json").read_text())
    assert meta["minutes"] == 3 and meta["simulated"]["virtual_minutes"] == 3 and meta["settings"]["num_tiers"] == 2
    assert json.loads((run / "summary.json").read_text()) == summary
    assert summary["failure"] is None and summary["simulated"] and summary["virtual_seconds"] == 180
    assert all(n > 0 for n in summary["tier_rounds"]) and summary["client_trainings"] >= summary["client_updates"]
    times = [e["time"] for e in events(run)]
    assert times == sorted(times) and times[-1] <= 180  # virtual seconds since the profiling pass
    assert summary["evaluations"] == len([e for e in events(run) if e["event"] == "evaluation"]) >= 12


def test_the_same_experiment_and_seed_give_the_same_events_signed_and_saved_or_not_and_another_seed_does_not(tmp_path):
    exp = Experiment("tiny", 2, 1, dict(SMALL))
    simulate(exp, tmp_path, 2, parts=fake_parts(8), tag="a")
    simulate(exp, tmp_path, 2, parts=fake_parts(8), tag="b")
    simulate(exp, tmp_path, 2, seed=1, parts=fake_parts(8), tag="c")
    light = simulate(exp, tmp_path, 2, parts=fake_parts(8), tag="d", signed=False, durable=False)  # what counts do
    a, b, c, d = ((tmp_path / t / "events.jsonl").read_bytes() for t in "abcd")
    assert a == b and a != c and a == d
    assert light["events_run"] == json.loads((tmp_path / "a" / "summary.json").read_text())["events_run"]
    assert json.loads((tmp_path / "c" / "experiment.json").read_text())["settings"]["seed"] == 1


def test_a_run_stopped_early_is_exactly_the_shorter_run(tmp_path):
    exp = Experiment("tiny", 2, 1, dict(SMALL))
    full = simulate(exp, tmp_path, 3, parts=fake_parts(8), tag="full")
    looks = iter(range(100))
    short = simulate(exp, tmp_path, 3, parts=fake_parts(8), tag="short", stop=lambda: next(looks) >= 2)
    assert short["virtual_seconds"] == 90.0 and full["virtual_seconds"] == 180.0  # stopped at the third look
    meta = json.loads((tmp_path / "short" / "experiment.json").read_text())["simulated"]
    assert meta["virtual_minutes"] == 1.5 and meta["planned_minutes"] == 3
    prefix = [e for e in events(tmp_path / "full") if e["time"] <= 90.0]
    assert events(tmp_path / "short") == prefix and len(prefix) < len(events(tmp_path / "full"))


@pytest.mark.tf
def test_a_simulation_reports_its_virtual_minutes_after_every_grain(tmp_path):
    seen: list[float] = []
    simulate(Experiment("tiny", 2, 1, dict(SMALL)), tmp_path, 2, parts=fake_parts(8), tag="p", progress=seen.append)
    assert len(seen) == round(2 * 60 / STOP_GRAIN)
    assert seen == sorted(seen) and abs(seen[-1] - 2.0) < 1e-9


@pytest.mark.slow
def test_a_tiny_logreg_experiment_runs_every_tier_learns_and_repeats_exactly_when_trained_in_a_pool(tmp_path):
    pytest.importorskip("tensorflow")
    if not FMNIST.exists():
        pytest.skip("Fashion-MNIST is not installed (make data)")
    yaml = tmp_path / "tiny.yaml"
    settings = {**SMALL, "dataset": "fashion-mnist", "model": "logreg", "partition": "shards", "samples_per_client": 60}
    settings.update(learning_rate=0.01, prox_lambda=0.0, classes_per_client=2)
    yaml.write_text(json.dumps({"name": "sim-tiny", "workers": 1, "minutes": 3, "settings": settings}))
    assert load_experiment(yaml).settings["model"] == "logreg"
    # The command line, twice, in fresh interpreters: the second trains in a pool of processes (fedat_sim.pool).
    for tag, processes in (("a", 1), ("b", 2)):
        cmd = [sys.executable, "-m", "fedat_sim", str(yaml), "--results", str(tmp_path), "--tag", tag]
        cmd += ["--processes", str(processes)]
        subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=300)
    run = tmp_path / "a"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["failure"] is None and len(summary["tier_rounds"]) == 2 and min(summary["tier_rounds"]) > 0
    curve = [e["accuracy"] for e in events(run) if e["event"] == "evaluation"]
    assert len(curve) >= 10 and max(curve) > curve[0] + 0.2  # it learns (10 classes: chance is 0.1)
    assert (run / "accuracy_vs_time.png").exists()
    assert (run / "events.jsonl").read_bytes() == (tmp_path / "b" / "events.jsonl").read_bytes()


def _first_after_each_boundary(published: list[float], end: float, offset: float) -> list[float]:
    """The first publication at or after each boundary 15·k − offset within (0, end]."""
    out, k = [], 1  # offset < 15: the first boundary is past 0
    while (b := 15 * k - offset) <= end:
        nxt = min((t for t in published if t >= b), default=None)
        if nxt is not None and nxt not in out:
            out.append(nxt)
        k += 1
    return out


def test_on_a_grid_the_simulated_evaluator_scores_the_first_version_of_each_15_s_slot(tmp_path):
    simulate(Experiment("tiny", 2, 1, {**SMALL, "eval_anchor": "grid"}), tmp_path, 3, parts=fake_parts(8), tag="g")
    evs = events(tmp_path / "g")
    published = [e["time"] for e in evs if e["event"] == "global"]
    scored = [e["time"] for e in evs if e["event"] == "evaluation"][1:]  # the first is the first version seen
    assert len(scored) >= 8
    # Event times count from the run's start, the evaluator's slots from its clock's zero: some offset between
    # the two makes the scores exactly the first publication after each boundary (one boundary sits at a score).
    assert any(_first_after_each_boundary(published, scored[-1], (-t + 0.0005) % 15) == scored for t in scored)

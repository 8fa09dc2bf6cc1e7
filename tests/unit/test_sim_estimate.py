"""`fedat compare --simulate --estimate`: the stand-ins count what a real run trains and scores, a probe times it here,
and the estimate lists only the runs still to do."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fedat.deploy.experiment import Experiment
from fedat_sim import estimate
from fedat_sim.compare import estimate_simulated

from .test_sim_simulate import SMALL

FMNIST = Path("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz")
# test_sim_simulate's small experiment on real data: 8 clients of 60 Fashion-MNIST samples, a logistic regression
TINY = {**SMALL, "dataset": "fashion-mnist", "model": "logreg", "partition": "shards", "classes_per_client": 2}
TINY.update(samples_per_client=60, epochs=2)
needs_data = pytest.mark.skipif(not FMNIST.exists(), reason="Fashion-MNIST is installed by `make data`")


def test_a_run_costs_its_steps_and_its_evaluations():
    s = estimate.Schedule(trainings=10, steps=1000, evaluations=4)
    assert estimate.cpu_seconds(s, estimate.Costs(step=0.005, evaluation=1.5)) == pytest.approx(11.0)
    assert estimate.steps_of(480, 3, 10) == 144 and estimate.steps_of(481, 1, 10) == 49


def test_runs_of_one_workload_share_a_probe_and_another_model_does_not():
    a = Experiment("a", 1, 1, dict(TINY))
    assert estimate.workload_key(a) == estimate.workload_key(Experiment("b", 1, 1, {**TINY, "strategy": "fedavg"}))
    assert estimate.workload_key(a) != estimate.workload_key(Experiment("c", 1, 1, {**TINY, "model": "cnn"}))


@needs_data
@pytest.mark.tf
@pytest.mark.slow
def test_the_stand_ins_count_what_the_real_run_trained_and_scored(tmp_path):
    (tmp_path / "tiny.yaml").write_text(json.dumps({"name": "tiny", "workers": 1, "minutes": 2, "settings": TINY}))
    cmd = [sys.executable, "-m", "fedat_sim", str(tmp_path / "tiny.yaml"), "--results", str(tmp_path), "--tag", "real"]
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=300)  # TensorFlow, in its own process
    real = json.loads((tmp_path / "real" / "summary.json").read_text())
    counted = estimate.schedule(Experiment("tiny", 1, 2, dict(TINY)), 0, 2, 0.005)
    assert real["failure"] is None and real["client_trainings"] > 20
    assert counted.trainings == real["client_trainings"] + real["profile_trainings"]
    assert counted.evaluations == real["evaluations"] >= 8
    # 60 training samples a client, batch 10: a task of 2 epochs is 12 steps, a profiling task of 1 epoch 6. Every
    # answer was trained, and so were the tasks still training at the end, at most one a client.
    answered = 12 * real["client_trainings"] + 6 * real["profile_trainings"]
    assert answered <= counted.steps <= answered + 12 * TINY["num_clients"]


@needs_data
@pytest.mark.tf
def test_the_probe_times_a_step_and_an_evaluation_of_the_real_model_here():
    costs = estimate.probe(Experiment("tiny", 1, 2, dict(TINY)))
    assert 0 < costs.step < 0.5 and 0 < costs.evaluation < 30  # a logistic regression's step is well under a ms


@needs_data
@pytest.mark.tf
def test_probes_for_a_sweep_side_by_side_time_at_the_same_time():
    timed = estimate.probes(Experiment("tiny", 1, 2, dict(TINY)).env(), 2)
    (a, (a0, a1)), (b, (b0, b1)) = timed
    assert a.step > 0 and b.step > 0 and a0 < b1 and b0 < a1  # the two timing windows overlap


@needs_data
def test_an_estimate_lists_the_runs_without_a_record_and_adds_them_up(tmp_path, monkeypatch):
    (tmp_path / "tiny.yaml").write_text(json.dumps({"name": "tiny", "workers": 1, "minutes": 1, "settings": TINY}))
    comparison = {
        "name": "tiny-cmp",
        "base": "tiny.yaml",
        "simulate": {"virtual_minutes": 1, "seeds": [0, 1], "method_minutes": {"fedavg": 2}},
        "methods": {"fedat": {}, "fedavg": {"num_tiers": 1}},
    }
    (tmp_path / "cmp.yaml").write_text(yaml.safe_dump(comparison))
    done = tmp_path / "sums" / "tiny-cmp" / "fedat" / "seed-0.json"
    done.parent.mkdir(parents=True)
    done.write_text(json.dumps({"method": "fedat", "seed": 0, "virtual_minutes": 1, "settings": {}}))
    short = tmp_path / "sums" / "tiny-cmp" / "fedavg" / "seed-1.json"  # fedavg runs 2 minutes: 1 is not done
    short.parent.mkdir(parents=True)
    short.write_text(json.dumps({"method": "fedavg", "seed": 1, "virtual_minutes": 1, "settings": {}}))
    probed = []
    monkeypatch.setattr(estimate, "probe", lambda exp, n: probed.append((exp.name, n)) or estimate.Costs(0.01, 2.0))
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    table = estimate_simulated(tmp_path / "cmp.yaml", tmp_path / "sums", jobs=2)
    rows = [line.split("|")[1:-1] for line in table.splitlines() if line.startswith(("| fedat ", "| fedavg "))]
    assert [(r[0].strip(), int(r[1]), float(r[2])) for r in rows] == [
        ("fedavg", 0, 2),
        ("fedat", 1, 1),
        ("fedavg", 1, 2),
    ]
    assert probed == [("tiny-cmp-fedavg", 2)]  # one workload, one probe: as many at once as runs side by side
    assert all(int(r[3].replace(",", "")) > 0 and r[6].strip().endswith(" s") for r in rows), rows
    assert "3 runs of 1–2 virtual min" in table and "| **all** |" in table and "2 at a time" in table
    one = estimate_simulated(tmp_path / "cmp.yaml", tmp_path / "sums", (1,), 2, 1.0)  # every run 1 minute
    assert "1 run of 1 virtual min" in one and "| fedavg " not in one  # fedavg seed 1's 1-minute record now counts
    pooled = estimate_simulated(tmp_path / "cmp.yaml", tmp_path / "sums", jobs=2, processes=3)
    assert "each training in 3 processes" in pooled

    def wall(text: str) -> float:
        return float(text.split("at least ")[1].split(" s of wall time")[0])

    assert abs(wall(pooled) - wall(table) / 3) <= 1  # 2 runs at once, each on 3 cores
    assert probed[-1] == ("tiny-cmp-fedavg", 6) and "on 6 cores, timed 6 at once" in pooled
    monkeypatch.setattr(os, "cpu_count", lambda: 2)  # no more side by side than the machine has cores
    capped = estimate_simulated(tmp_path / "cmp.yaml", tmp_path / "sums", jobs=2, processes=3)
    assert probed[-1] == ("tiny-cmp-fedavg", 2) and abs(wall(capped) - wall(table)) <= 1

    comparison["simulate"]["methods"] = ["fedat"]  # the file's sweep leaves fedavg out ...
    (tmp_path / "cmp.yaml").write_text(yaml.safe_dump(comparison))
    swept = estimate_simulated(tmp_path / "cmp.yaml", tmp_path / "sums", jobs=2)
    assert "1 run of 1 virtual min" in swept and "| fedat " in swept and "| fedavg " not in swept
    named = estimate_simulated(tmp_path / "cmp.yaml", tmp_path / "sums", jobs=2, methods_only=("fedavg",))
    assert "2 runs of 2 virtual min" in named  # ... unless the command line names it

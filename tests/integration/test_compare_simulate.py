"""`fedat compare --simulate` end to end: a small comparison on two seeds, two runs at once, records, resume, tables.

The real TensorFlow trainer in spawned processes (logistic regression on a few Fashion-MNIST clients, so each run
takes seconds); the command line is the one users type.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from fedat.lab import sweep

pytestmark = [pytest.mark.tf, pytest.mark.slow]

FMNIST = Path("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz")
BASE = {
    "name": "tiny",
    "workers": 1,
    "minutes": 1,
    "settings": {
        "strategy": "fedat",
        "dataset": "fashion-mnist",
        "model": "logreg",
        "partition": "shards",
        "classes_per_client": 2,
        "num_clients": 8,
        "samples_per_client": 60,
        "num_tiers": 2,
        "clients_per_round": 3,
        "min_clients": 2,
        "epochs": 1,
        "batch_size": 10,
        "time_scale": 1.0,
        "delays": [0, 1, 4, 6],
        "device_factor": [1, 1.5],
        "step_seconds": 0.05,
        "eval_every": 0,
        "eval_interval": 10,
        "profile_concurrency": 8,
        "min_deadline": 3,
        "seed": 0,
    },
}
COMPARISON = {
    "name": "tiny-cmp",
    "base": "tiny.yaml",
    "targets": [0.3, 0.5],
    "simulate": {"virtual_minutes": 0.75, "seeds": [0, 1], "single_seed": ["fedavg"]},
    "methods": {"fedat": {}, "fedavg": {"num_tiers": 1, "min_clients": 3}},
}


def fedat(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "fedat.cli", *args], cwd=cwd, capture_output=True, text=True, timeout=600
    )


@pytest.mark.skipif(not FMNIST.exists(), reason="Fashion-MNIST is installed by `make data`")
def test_a_simulated_comparison_leaves_a_record_per_run_resumes_and_tabulates(tmp_path):
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(BASE))
    (tmp_path / "cmp.yaml").write_text(yaml.safe_dump(COMPARISON))
    sums = tmp_path / "sums"
    args = ("compare", "cmp.yaml", "--simulate", "--jobs", "2", "--results", "runs", "--summaries", str(sums))
    first = fedat(*args, cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "3 runs of 0.75 virtual min, 2 at a time" in first.stdout  # fedavg on the first seed only
    records = sweep.load_records(sums)["tiny-cmp"]
    assert {m: [r["seed"] for r in recs] for m, recs in records.items()} == {"fedat": [0, 1], "fedavg": [0]}
    for recs in records.values():
        for r in recs:
            assert r["summary"]["failure"] is None and r["summary"]["global_updates"] > 0 and r["curve"]
            assert r["virtual_minutes"] == 0.75 and r["targets"] == [0.3, 0.5]
    # the two fedat seeds are different runs (partition, selection, delays), each reproducible
    assert records["fedat"][0]["curve"] != records["fedat"][1]["curve"]
    assert len([d for d in (tmp_path / "runs").iterdir() if d.is_dir()]) == 3
    assert "| fedat | 0,1 |" in (tmp_path / "runs" / "tiny-cmp-sim.md").read_text()

    again = fedat(*args, cwd=tmp_path)
    assert again.returncode == 0 and "0 runs of 0.75 virtual min" in again.stdout, again.stderr[-3000:]
    assert len([d for d in (tmp_path / "runs").iterdir() if d.is_dir()]) == 3  # nothing ran again

    table = fedat("tabulate", "--sweeps", str(sums), cwd=tmp_path)
    assert table.returncode == 0 and "### tiny-cmp (0.75 virtual min per run)" in table.stdout
    rec = json.loads(sweep.record_path(sums, "tiny-cmp", "fedat", 1).read_text())
    assert rec["settings"]["seed"] == 1

    # another comparison with fedat's very settings under another name files that run instead of running it again
    other = {**COMPARISON, "name": "tiny-other", "simulate": {"virtual_minutes": 0.5, "seeds": [0]}}
    other["methods"] = {"k3": {}, "k2": {"clients_per_round": 2}}
    (tmp_path / "other.yaml").write_text(yaml.safe_dump(other))
    third = fedat("compare", "other.yaml", *args[2:], cwd=tmp_path)
    assert third.returncode == 0, third.stderr[-3000:]
    assert "k3 seed 0: the same run as tiny-cmp/fedat/seed-0" in third.stdout
    assert "1 run of 0.5 virtual min" in third.stdout  # only k2 ran
    assert len([d for d in (tmp_path / "runs").iterdir() if d.is_dir()]) == 4
    k3 = json.loads(sweep.record_path(sums, "tiny-other", "k3", 0).read_text())
    original = json.loads(sweep.record_path(sums, "tiny-cmp", "fedat", 0).read_text())
    assert k3["curve"] == original["curve"] and k3["reused_from"] == "tiny-cmp/fedat/seed-0"
    assert "| k3 | 0* |" in (tmp_path / "runs" / "tiny-other-sim.md").read_text()


@pytest.mark.skipif(not FMNIST.exists(), reason="Fashion-MNIST is installed by `make data`")
def test_sigterm_stops_a_sweep_files_what_ran_starts_nothing_else_and_never_shortens_a_record(tmp_path):
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(BASE))
    (tmp_path / "cmp.yaml").write_text(yaml.safe_dump(COMPARISON))
    sums = tmp_path / "sums"
    args = ("compare", "cmp.yaml", "--simulate", "--jobs", "1", "--summaries", str(sums))
    first = fedat(*args, "--results", "short", "--methods", "fedat", "--seeds", "0", cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    short = json.loads(sweep.record_path(sums, "tiny-cmp", "fedat", 0).read_text())
    assert short["virtual_minutes"] == 0.75

    # 30 virtual minutes of fedat seeds 0 and 1 and fedavg seed 0, one at a time; SIGTERM once the first has begun
    runs = tmp_path / "long"
    proc = subprocess.Popen(
        [sys.executable, "-m", "fedat.cli", *args, "--results", str(runs), "--virtual-minutes", "30"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 300
        while not (runs.exists() and any(runs.iterdir())) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)  # the very process the user started: `fedat compare` is the sweep itself
        out, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-3000:]
    assert "SIGTERM: the runs in progress end early" in out and "stopped: 2 runs not started" in out, out
    started = [d for d in runs.iterdir() if d.is_dir()]
    assert [d.name.split("-")[2] + d.name.split("-")[3] for d in started] == ["fedatseed0"]  # nothing else began
    ran = json.loads((started[0] / "experiment.json").read_text())["simulated"]
    assert ran["planned_minutes"] == 30 and ran["virtual_minutes"] < 30
    rec = json.loads(sweep.record_path(sums, "tiny-cmp", "fedat", 0).read_text())
    if ran["virtual_minutes"] < short["virtual_minutes"]:
        assert rec == short  # the stopped run is a prefix of the record already there: that one stays
    else:
        assert rec["virtual_minutes"] == ran["virtual_minutes"]  # longer: it replaces the short record, which it holds
        assert sweep.truncated(rec, short["virtual_minutes"])["curve"] == short["curve"]
    assert not sweep.record_path(sums, "tiny-cmp", "fedat", 1).exists()
    assert not sweep.record_path(sums, "tiny-cmp", "fedavg", 0).exists()

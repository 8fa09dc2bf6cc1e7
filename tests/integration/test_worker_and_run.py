"""A real worker process (TensorFlow) killed mid-task, and a short end-to-end FedAT run through `fedat run`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from fedat import topology
from fedat.signing import Keyring

from .broker import fetch, queue_counts, running, wait_for
from .test_pipeline import aggregator, barrier, start_tier

pytestmark = [pytest.mark.broker, pytest.mark.tf, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]


SECRET = bytes(range(32, 64))  # a test deployment's signing secret: every message below is signed and verified
KEYRING = Keyring.from_secret(SECRET)


def worker_env(url: str) -> dict[str, str]:
    return {
        **os.environ,
        "FEDAT_SIGNING_SECRET": SECRET.hex(),
        "FEDAT_AMQP_URL": url,
        "FEDAT_NUM_TIERS": "1",
        "FEDAT_NUM_CLIENTS": "4",
        "FEDAT_SAMPLES_PER_CLIENT": "400",
        "FEDAT_MODEL": "logreg",
        "FEDAT_METRICS_PORT": "0",
        "FEDAT_PROFILE_QUEUE": "0",
        "FEDAT_DEVICE_FACTOR": "1,1",
        "FEDAT_TIME_SCALE": "0",
        "TF_CPP_MIN_LOG_LEVEL": "2",
    }


def start_worker(url: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "fedat_worker.worker_main"],
        env=worker_env(url),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def test_a_worker_killed_mid_task_loses_nothing_and_counts_nothing_twice(vhost_url):
    queue = topology.train_queue(1)
    # Enough epochs that the task is surely still training when the worker is killed.
    with (
        running(
            barrier(clients_per_round=2, min_clients=2, epochs=3000, min_deadline=900), vhost_url, 1, keyring=KEYRING
        ),
        running(aggregator(), vhost_url, 1, keyring=KEYRING),
    ):
        # the worker's logistic regression
        start_tier(vhost_url, (0, 1, 2, 3), shapes=[(784, 10), (10,)], keyring=KEYRING)
        first = start_worker(vhost_url)
        try:
            wait_for(lambda: queue_counts(vhost_url).get(queue, (0, 0))[1] >= 1, 120, "the worker to take a task")
            os.kill(first.pid, signal.SIGKILL)
            first.wait(timeout=10)
            # The killed worker's task is back in the queue: both tasks are ready again.
            wait_for(lambda: queue_counts(vhost_url).get(queue, (0, 0)) == (2, 0), 30, "the task to be requeued")
        finally:
            if first.poll() is None:
                first.kill()
        second = start_worker(vhost_url)
        try:
            fetch(vhost_url, topology.RECORDER_GLOBAL)  # the seed
            g = fetch(vhost_url, topology.RECORDER_GLOBAL, timeout=240)
            assert g is not None, "no global model after the restart"
            assert g.version == 1 and g.updates == 2 and g.tier_counts == (1,)
            dead = fetch(vhost_url, topology.DEAD_LETTERS, timeout=1, raw=True)
            assert dead is None, f"dead-lettered: {dead[0].headers}"
        finally:
            second.send_signal(signal.SIGTERM)
            second.wait(timeout=30)


def test_a_short_calibrated_fedat_run_learns_rescales_its_latency_model_and_reports_worker_utilisation(tmp_path):
    # `make run` in small: smoke.yaml at a modelled 90 % load (the probe and the virtual-time demand pick the time
    # scale), end to end through `fedat run`, real RabbitMQ and two TensorFlow workers.
    text = (ROOT / "experiments" / "smoke.yaml").read_text().replace("minutes: 1\n", "minutes: 1\ncalibrate: 0.9\n")
    assert "calibrate: 0.9" in text
    (tmp_path / "smoke-calibrated.yaml").write_text(text)
    results = tmp_path / "results"
    cmd = [sys.executable, "-m", "fedat.cli", "run", str(tmp_path / "smoke-calibrated.yaml"), "--results", str(results)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=480)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (run,) = results.iterdir()
    summary = json.loads((run / "summary.json").read_text())
    meta = json.loads((run / "experiment.json").read_text())
    cal = summary["calibration"]
    assert cal == meta["calibration"] and cal["target"] == 0.9 and cal["reference_time_scale"] == 0.1
    assert cal["step_cost_seconds"] > 0 and len(cal["probe"]["probes"]) == 2 and cal["simulated"]
    # the services ran with the calibrated time scale; the nominal step cost, hence the tiers' ratios, is the file's
    assert meta["settings"]["time_scale"] == round(cal["time_scale"], 6) != 0.1
    assert summary["latency_model"]["time_scale"] == meta["settings"]["time_scale"]
    assert "step_seconds" not in meta["settings"] and cal["step_seconds"] == 0.0  # smoke.yaml: measured times
    u = summary["worker_utilisation"]
    assert set(u["per_worker"]) == {"worker-0", "worker-1"} and u["window_seconds"] > 10
    assert all(0 < x < 1.5 for x in u["per_worker"].values()), u  # CPU seconds per second of one process
    assert 0 < u["training_mean"] <= 1.05, u
    assert "workers busy" in r.stdout
    # it learns, every tier takes part, and the results folder is complete
    assert summary["global_updates"] >= 10, summary
    assert summary["best_accuracy"] > 0.35, summary  # 10 classes: chance is 0.1
    assert all(n > 0 for n in summary["tier_rounds"]), summary
    lines = [json.loads(x) for x in (run / "events.jsonl").read_text().splitlines()]
    assert sum(e["event"] == "global" and e["version"] > 0 for e in lines) == summary["global_updates"]
    assert (run / "accuracy_vs_time.png").stat().st_size > 0 and (run / "accuracy_vs_bytes.png").stat().st_size > 0

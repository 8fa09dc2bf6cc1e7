"""A real worker process (TensorFlow) killed mid-task (the end-to-end `fedat run` is test_observability's run)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from fedat.protocol import topology
from fedat.protocol.signing import Keyring

from .broker import fetch, queue_counts, running, wait_for
from .test_pipeline import aggregator, barrier, start_tier

pytestmark = [pytest.mark.broker, pytest.mark.tf, pytest.mark.slow, pytest.mark.alone]
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
            # SIGTERM mid-task (round 2, 3000 epochs): the worker gives the task back within an epoch and exits 0.
            wait_for(
                lambda: queue_counts(vhost_url).get(queue, (0, 0))[1] >= 1, 120, "the worker to take a round-2 task"
            )
            second.send_signal(signal.SIGTERM)
            assert second.wait(timeout=30) == 0
            # The queue's counts trail the nack by a moment; a task that was finished instead would stay acked.
            wait_for(lambda: queue_counts(vhost_url).get(queue) == (2, 0), 30, "the interrupted task to be given back")
        finally:
            if second.poll() is None:
                second.kill()

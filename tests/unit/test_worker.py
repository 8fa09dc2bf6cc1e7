"""The worker's handler with a stand-in trainer: drop-outs count from the run start every task carries."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import numpy as np

from fedat.fl.latency import ClientProfile
from fedat.protocol import topology
from fedat.protocol.wire import TrainTask, encode_model
from fedat_worker.worker import Worker, WorkerConfig

from ..driver import Driver


class Trainer:
    """Returns the weights plus one, as if trained."""

    def train(self, weights, x, y, **kw):
        from fedat_worker.training import TrainResult

        return TrainResult([w + 1 for w in weights], len(x), 0.5, 0.01)


def worker(drops_at: float | None) -> Driver:
    clients = [SimpleNamespace(x_train=np.zeros((4, 2)), y_train=np.zeros(4))]
    profiles = (ClientProfile(client=0, group=0, delay=(0.0, 0.0), device_factor=1.0, drops_at=drops_at),)
    init = [np.zeros(2, np.float32)]
    return Driver(Worker(WorkerConfig(tiers=(1,)), clients, Trainer(), ["w"], init, profiles, lambda: 0.0))


def task(run_started_at: float) -> TrainTask:
    layers = encode_model([np.zeros(2, np.float32)], ["w"], "raw")
    return TrainTask("t1-r1-c0-v0", 0, 1, 1, 0, 1, 10, 1e-3, 0.0, "raw", 4, 100.0, layers, run_started_at)


def test_a_client_drops_out_at_its_time_after_the_run_start_the_task_carries():
    w = worker(drops_at=10.0)
    (out,) = w.deliver(topology.train_queue(1), task(run_started_at=100.0), now=109.0).publish
    assert out.message.client == 0 and out.exchange == topology.RESULTS
    gone = w.deliver(topology.train_queue(1), task(run_started_at=100.0), now=110.5)
    assert gone.publish == () and gone.ack == (w.tag,)  # left for good: acked, no answer
    late_run = w.deliver(topology.train_queue(1), task(run_started_at=105.0), now=110.5)
    assert late_run.publish  # the same moment, a later run start: still there


def test_without_a_run_start_or_a_drop_time_nobody_drops():
    assert worker(drops_at=10.0).deliver(topology.train_queue(1), task(run_started_at=0.0), now=1e9).publish
    never = replace(task(100.0), id="t1-r1-c0-v0")
    assert worker(drops_at=None).deliver(topology.train_queue(1), never, now=1e9).publish

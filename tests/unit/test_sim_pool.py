"""Training in a pool of processes gives the very run one process gives (`fedat_sim.pool`)."""

from __future__ import annotations

import functools
import json
import multiprocessing
import time
from dataclasses import replace

import pika
import pytest

from fedat.deploy.experiment import Experiment
from fedat.protocol import topology
from fedat_sim.clock import Clock
from fedat_sim.fakes import fake_parts
from fedat_sim.memory import MemoryBroker
from fedat_sim.pool import PoolTrainer
from fedat_sim.simulate import cpu_seconds, simulate

from .test_sim_simulate import SMALL

RECIPE = functools.partial(fake_parts, 8)  # pickles: each pool process builds the same clients and trainer


def _same(a: dict, b: dict) -> None:
    for key in set(a) | set(b):
        if key not in ("wall_seconds", "cpu_seconds", "run_dir"):
            assert a.get(key) == b.get(key), key


@pytest.mark.parametrize("strategy", ["fedat", "fedasync"])
def test_a_run_trained_in_a_pool_is_the_run_trained_in_one_process(tmp_path, strategy):
    exp = Experiment("tiny", 2, 1, {**SMALL, "strategy": strategy, "concurrency": 6})
    one = simulate(exp, tmp_path, 2, parts=RECIPE, tag="one", plots=False)
    pool = simulate(exp, tmp_path, 2, parts=RECIPE, tag="pool", plots=False, processes=2)
    assert one["client_trainings"] > 50 and one["failure"] is None and pool["handler_errors"] == 0
    _same(one, pool)
    assert (tmp_path / "one" / "events.jsonl").read_bytes() == (tmp_path / "pool" / "events.jsonl").read_bytes()
    meta = json.loads((tmp_path / "pool" / "experiment.json").read_text())["simulated"]
    assert meta["training_processes"] == 2


def test_a_pool_needs_a_nominal_step_and_a_recipe(tmp_path):
    measured = Experiment("tiny", 2, 1, {**SMALL, "step_seconds": 0})
    with pytest.raises(ValueError, match="needs a nominal step_seconds"):
        simulate(measured, tmp_path, 1, parts=RECIPE, tag="a", processes=2)
    with pytest.raises(ValueError, match="give a recipe, not built parts"):
        simulate(Experiment("tiny", 2, 1, dict(SMALL)), tmp_path, 1, parts=fake_parts(8), tag="b", processes=2)


def test_a_message_is_finished_once_when_it_becomes_visible_whatever_the_copies():
    clock = Clock()
    broker = MemoryBroker(clock)
    broker.declare_topology(1)
    seen: list[bytes] = []
    broker.taps.append(lambda exchange, key, body, props: seen.append(body))
    calls: list[float] = []

    def finish(exchange, key, body, props):
        calls.append(clock.now)
        return body + b"!", props

    class Twice:
        def copies(self, exchange, key, props):
            return 2

        def delivery_delay(self, queue, connection):
            return 0.0

    broker.hooks = Twice()
    props = pika.BasicProperties(type="update")
    broker.publish(topology.RESULTS, topology.tier_key(1), b"u", props, visible_at=clock.now + 5, finish=finish)
    clock.run(clock.now + 4)
    assert calls == [] and seen == []
    clock.run(clock.now + 2)
    assert len(calls) == 1 and seen == [b"u!", b"u!"]


def _broken_parts():
    parts = fake_parts(8)

    class Failing(type(parts.trainer)):
        def train(self, *args, **kwargs):
            raise RuntimeError("out of memory")

    return replace(parts, trainer=Failing())


def test_a_training_that_fails_in_the_pool_ends_the_run_naming_it(tmp_path):
    summary = simulate(Experiment("tiny", 2, 1, dict(SMALL)), tmp_path, 1, parts=_broken_parts, tag="x", processes=2)
    assert "failed in its process: RuntimeError: out of memory" in summary["failure"]


def test_a_task_trained_twice_before_its_update_is_visible_is_finished_twice():
    # A worker killed after publishing and before its ack gets the task again: two trainings of one (client, seed).
    parts = fake_parts(8)
    pool = PoolTrainer(parts, RECIPE, 2)
    try:
        data = parts.clients[3]
        start = [w + 1 for w in parts.initial]
        for _ in range(2):
            stand_in = pool.train(start, data.x_train, data.y_train, epochs=2, prox_lambda=0.4, seed=7)
            assert stand_in.weights is start and stand_in.loss == 0.0
        want = parts.trainer.train(start, data.x_train, data.y_train, epochs=2, prox_lambda=0.4, seed=7)
        for _ in range(2):
            got, base = pool.finish(3, 7)
            assert base is start and got.loss == want.loss
            assert all((g == w).all() for g, w in zip(got.weights, want.weights, strict=True))
        with pytest.raises(RuntimeError, match="no training of client 3 with seed 7 is in flight"):
            pool.finish(3, 7)
    finally:
        pool.close()


def _burn(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_a_runs_compute_counts_the_processes_it_trained_in_once_they_ended():
    # a pooled run's record would otherwise show only its main process's CPU: a few per cent of what it cost
    before = cpu_seconds()
    child = multiprocessing.get_context("spawn").Process(target=_burn, args=(0.5,))
    child.start()
    child.join()
    assert child.exitcode == 0 and cpu_seconds() - before >= 0.5

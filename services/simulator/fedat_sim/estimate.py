"""What a simulated sweep's runs will cost on this machine, before any of them starts (`--estimate`).

A run's compute is its training and its scoring; the services' own work is a few per cent of it. With a nominal
`step_seconds` a run's schedule (which client trains when, so how many mini-batch steps and evaluations it takes) does
not depend on what the models learn. TiFL is the exception: it picks tiers by accuracy, so its count is an estimate.
The production services in virtual time, with numpy stand-ins of the real clients' sizes, count them exactly, in
seconds to minutes. Probes in processes of their own then time one mini-batch step and one evaluation of the real model
here, in CPU seconds, so that other work sharing the cores does not count; as many at once as the sweep will train
side by side, since two trainings on two cores that share a cache or a physical core each take longer than one alone
(about 1.5x on this project's two-core machines). Machines of this kind differ by up to 7.6x in training speed, so
nothing is taken from records made on another machine.
"""

from __future__ import annotations

import math
import statistics
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from multiprocessing import get_context
from pathlib import Path

from fedat.deploy.experiment import Experiment
from fedat.runtime import config
from fedat_sim.clients import Parts
from fedat_sim.demand import TimedTrainer, parts
from fedat_worker.workload import load_clients, workload_from_env

PROBE_TRAININGS = 2  # timed after one untimed training (TensorFlow traces its step function on the first)
PROX_LAMBDA = 0.4  # the proximal term costs a little; time it as FedAT trains
PEER_TIMEOUT = 600.0  # seconds a probe waits for its peers to load TensorFlow and build the model
# The settings a step's and an evaluation's cost follow from: one probe for each distinct combination of them.
WORKLOAD = ("app", "dataset", "model", "num_clients", "samples_per_client", "partition", "batch_size", "tf_threads")


@dataclass(frozen=True)
class Schedule:
    """What one run asks of the trainer: client trainings (profiling included), their mini-batch steps, evaluations."""

    trainings: int
    steps: int
    evaluations: int


@dataclass(frozen=True)
class Costs:
    """CPU seconds here of one mini-batch step and of one evaluation of every client's test split."""

    step: float
    evaluation: float


def workload_key(exp: Experiment) -> tuple[str, ...]:
    """What a probe of `exp` stands for: runs with the same key cost the same a step and an evaluation."""
    return tuple(str(exp.settings.get(k)) for k in WORKLOAD)


def cpu_seconds(schedule: Schedule, costs: Costs) -> float:
    """The CPU seconds a run with this schedule takes at these costs."""
    return schedule.steps * costs.step + schedule.evaluations * costs.evaluation


def steps_of(samples: int, epochs: int, batch_size: int) -> int:
    """Mini-batch steps of one training: a partial last batch is a step."""
    return epochs * math.ceil(samples / batch_size)


class CountingTrainer(TimedTrainer):
    """The demand model's stand-in trainer, counting the mini-batch steps the real trainer would take."""

    def __init__(self, step_seconds: float):
        super().__init__(step_seconds)
        self.steps = 0

    def train(self, weights, x, y, *, epochs, batch_size=None, **kw):
        """The stand-in's step, counted."""
        self.steps += steps_of(len(x), epochs, batch_size or 10)
        return super().train(weights, x, y, epochs=epochs, batch_size=batch_size, **kw)


def schedule(exp: Experiment, seed: int, minutes: float, step_seconds: float) -> Schedule:
    """Run `exp` on `seed` for `minutes` of virtual time with stand-ins; count what it trains and scores.

    `step_seconds` is what a step takes here: an experiment without a nominal `step_seconds` times its latencies by it.
    """
    from fedat_sim.simulate import simulate

    exp = replace(exp, settings={**exp.settings, "seed": seed})
    sizes = [len(c.x_train) for c in load_clients(workload_from_env(exp.env()))]
    stand_ins = parts(sizes, step_seconds, seed)
    trainer = CountingTrainer(step_seconds)
    counted = Parts(stand_ins.clients, trainer, stand_ins.names, stand_ins.initial)
    with tempfile.TemporaryDirectory() as folder:
        # unsigned and without checkpoints: the same events with less work (test_sim_estimate holds it to a real run)
        s = simulate(exp, Path(folder), minutes, parts=counted, plots=False, signed=False, durable=False)
    if s["failure"]:
        raise RuntimeError(f"{exp.name}: its schedule could not be counted: {s['failure']}")
    return Schedule(s["client_trainings"] + s["profile_trainings"], trainer.steps, s["evaluations"])


def probe(exp: Experiment, at_once: int = 1) -> Costs:
    """Time a step and an evaluation of `exp`'s real model and data here: the mean of `at_once` probes timing side by
    side, each in a spawned process (TensorFlow)."""
    timed = probes(exp.env(), at_once)
    return Costs(statistics.fmean(c.step for c, _ in timed), statistics.fmean(c.evaluation for c, _ in timed))


def probes(env: dict[str, str], at_once: int) -> list[tuple[Costs, tuple[float, float]]]:
    """`at_once` probes of the workload `env` names, each with the wall-clock window it timed in: every window opens
    once all of them have built their model, so they time side by side."""
    ctx = get_context("spawn")
    with ctx.Manager() as manager, ProcessPoolExecutor(at_once, mp_context=ctx) as pool:
        ready = manager.Barrier(at_once)  # a task waits here for its peers, so no worker can take two
        return [f.result() for f in [pool.submit(_probe, env, ready) for _ in range(at_once)]]


def _probe(env: dict[str, str], ready) -> tuple[Costs, tuple[float, float]]:
    from fedat_sim.clients import tensorflow_parts

    real = tensorflow_parts(workload_from_env(env), config.get_int(env, "FEDAT_TF_THREADS", 1))
    epochs, batch = config.get_int(env, "FEDAT_EPOCHS", 3), config.get_int(env, "FEDAT_BATCH_SIZE", 10)
    weights = list(real.initial)

    def train(i: int) -> int:
        c = real.clients[i % len(real.clients)]
        real.trainer.train(
            weights, c.x_train, c.y_train, epochs=epochs, prox_lambda=PROX_LAMBDA, seed=i, batch_size=batch
        )
        return steps_of(len(c.x_train), epochs, batch)

    tests = [(c.x_test, c.y_test) for c in real.clients]
    train(0)
    real.trainer.evaluate_per_client(weights, tests)  # both traced before the peers start timing
    ready.wait(timeout=PEER_TIMEOUT)
    opened = time.time()
    start = time.process_time()
    steps = sum(train(i) for i in range(1, PROBE_TRAININGS + 1))
    step = (time.process_time() - start) / steps
    start = time.process_time()
    real.trainer.evaluate_per_client(weights, tests)
    return Costs(step, time.process_time() - start), (opened, time.time())

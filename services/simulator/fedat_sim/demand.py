"""`python -m fedat_sim.demand`: the training work an experiment's latency model releases, measured in virtual time.

Reads {"experiment": {name, workers, minutes, settings}, "train_samples": [...], "measured_step_seconds": s} on
stdin; runs the production services in virtual time with numpy stand-ins for the data and the trainer (each client
keeps its real number of training samples, so its steps and its modelled latency are the real ones); prints one
JSON line: the mini-batch steps trained between the first global update and the end, and that window's length.
`fedat run` turns it into the workers' modelled utilisation (`fedat.calibrate`). No TensorFlow, a few seconds.
"""

from __future__ import annotations

import json
import logging
import random
import sys
import tempfile
from dataclasses import dataclass

import msgpack
import numpy as np
import pika

from fedat import topology
from fedat.recorder import RunState
from fedat.run import Experiment
from fedat_sim.clients import Parts
from fedat_sim.clock import Clock
from fedat_sim.fakes import SHAPES, FakeResult, FakeTrainer
from fedat_sim.memory import MemoryBroker
from fedat_sim.system import System
from fedat_worker.data import ClientData


@dataclass
class Tally:
    """Steps trained per client task, counted from the first global update on."""

    steps_per_client: list[int]
    start: float | None = None
    steps: int = 0
    trainings: int = 0


class TimedTrainer(FakeTrainer):
    """The stand-in trainer, reporting the seconds the measured step cost gives (latency with step_seconds 0)."""

    def __init__(self, step_seconds: float):
        self.step_seconds = step_seconds

    def train(self, weights, x, y, *, epochs, batch_size=None, **kw) -> FakeResult:
        """FakeTrainer's step, timed as this machine would take."""
        r = super().train(weights, x, y, epochs=epochs, batch_size=batch_size, **kw)
        return FakeResult(r.weights, r.n_samples, r.loss, epochs * -(-len(x) // (batch_size or 10)) * self.step_seconds)


def parts(train_samples: list[int], step_seconds: float, seed: int = 0) -> Parts:
    """Stand-in clients with the real sizes (constant targets, as `fakes.fake_parts`) and a timed trainer."""
    rng = np.random.default_rng([seed, 0xFA4E])
    clients = []
    for n in train_samples:
        x = np.full((n, 2), np.float32(rng.uniform(-1.0, 1.0)), np.float32)
        y = rng.integers(0, 2, n)
        clients.append(ClientData(x, y, x[: max(1, n // 4)], y[: max(1, n // 4)]))
    initial = tuple(np.zeros(s, np.float32) for s in SHAPES)
    return Parts(tuple(clients), TimedTrainer(step_seconds), tuple(f"layer{i}" for i in range(len(SHAPES))), initial)


def measure(exp: Experiment, train_samples: list[int], step_seconds: float) -> dict:
    """Steps trained in the window from the first global update to the end of `exp.minutes`, in virtual time."""
    seed = int(exp.settings.get("seed", 0))
    batch, epochs = int(exp.settings.get("batch_size", 10)), int(exp.settings.get("epochs", 3))
    tally = Tally([epochs * -(-n // batch) for n in train_samples])
    clock = Clock(rng=random.Random(seed))
    broker = MemoryBroker(clock)

    def tap(exchange: str, routing_key: str, body: bytes, properties: pika.BasicProperties) -> None:
        if exchange == topology.GLOBAL and tally.start is None:
            if msgpack.unpackb(body, raw=False).get("version", 0) >= 1:
                tally.start = clock.now
        elif exchange == topology.RESULTS and routing_key != topology.PROFILE_KEY and tally.start is not None:
            tally.trainings += 1
            tally.steps += tally.steps_per_client[msgpack.unpackb(body, raw=False)["client"]]

    broker.taps.append(tap)
    end = clock.now + exp.minutes * 60.0
    with tempfile.TemporaryFile("w") as events:
        system = System(exp, parts(train_samples, step_seconds, seed), clock, broker, RunState(clock.now), events, 1)
        system.start()
        try:
            clock.run(end)
        finally:
            system.stop()
    start = end if tally.start is None else tally.start
    return {"window_seconds": end - start, "steps": tally.steps, "trainings": tally.trainings}


def main() -> None:
    """Read the request on stdin, print the measurement."""
    logging.basicConfig(level=logging.ERROR)
    req = json.load(sys.stdin)
    e = req["experiment"]
    exp = Experiment(str(e["name"]), int(e["workers"]), float(e["minutes"]), dict(e["settings"]))
    print(json.dumps(measure(exp, list(req["train_samples"]), float(req["measured_step_seconds"]))), flush=True)


if __name__ == "__main__":
    main()

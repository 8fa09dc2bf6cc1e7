"""Simulated clients: each logical client trains on its own virtual core and answers at its `not_before`.

The worker is the production `fedat_worker.worker.Worker`, training for real with the project's trainer in this
process. Its latency model (`fedat.fl.latency`) sets an update's `not_before` = dispatch + (training seconds × the
client's device factor + its delay group's delay) × time scale, where training seconds are the measured seconds of
this very training or, with `step_seconds`, the nominal epochs × ceil(n / batch) × step_seconds. A real worker
publishes at once and the barrier counts the update from `not_before`; here the broker keeps the update invisible
until `not_before` in virtual time, so the barrier and the profiler receive it exactly when the client would have
answered. Training takes no virtual time and the worker consumes without a prefetch limit: no client ever waits for
a shared worker process, as if each had a core of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np
import pika

from fedat.fl.latency import ClientProfile
from fedat_sim.clock import Clock
from fedat_sim.memory import MemoryConnection
from fedat_worker.datasets import ClientData
from fedat_worker.training import Trainer
from fedat_worker.worker import Worker, WorkerConfig


@dataclass(frozen=True)
class Parts:
    """What trains and scores: every client's data, one trainer (train, evaluate_per_client), the initial model."""

    clients: Sequence[ClientData]
    trainer: Trainer
    names: tuple[str, ...]
    initial: tuple[np.ndarray, ...]


@dataclass(frozen=True)
class TensorflowRecipe:
    """Builds `tensorflow_parts(workload, threads)`; pickles, so a pool process can build the same parts."""

    workload: Any
    threads: int = 1

    def __call__(self) -> Parts:
        """The parts."""
        return tensorflow_parts(self.workload, self.threads)


def tensorflow_parts(workload: Any, threads: int = 1) -> Parts:
    """The experiment's data set and model with the project's trainer (imports TensorFlow, builds once)."""
    from fedat_worker.models import weight_names
    from fedat_worker.workload import build

    clients, model, trainer = build(workload, threads)
    return Parts(clients, trainer, tuple(weight_names(model)), tuple(w.copy() for w in model.get_weights()))


def answer_time(exchange: str, routing_key: str, body: bytes, properties: pika.BasicProperties) -> float | None:
    """When a published message becomes visible: an update at its `not_before`, anything else at once."""
    if properties.type != "update":
        return None
    return float(msgpack.unpackb(body, raw=False)["not_before"])


def answer_at_not_before(conn: MemoryConnection) -> None:
    """Configure a worker's connection so that its updates reach the broker's queues at their `not_before`."""
    conn.visible_at = answer_time


def simulated_worker(cfg: WorkerConfig, parts: Parts, profiles: tuple[ClientProfile, ...], clock: Clock) -> Worker:
    """The production worker on the virtual clock (its `started_at`/`finished_at` are virtual times)."""
    return Worker(cfg, parts.clients, parts.trainer, list(parts.names), list(parts.initial), profiles, clock)

"""Trainings in a pool of processes: a simulated run uses several cores, and its schedule and records do not change.

A simulated client's update becomes visible at its `not_before` (`fedat_sim.clients`), and with a nominal
`step_seconds` that time is known before the client trains. So the worker's training can run in another process
while virtual time goes on, and only the update's model has to be ready when the update becomes visible:

- `PoolTrainer.train` (called in the worker's handler) sends the job to a process and answers at once with a
  stand-in result: the start weights, n_samples, loss and seconds 0. The worker builds, signs and publishes its
  update from it as usual, and the broker holds the update until `not_before`.
- At `not_before`, before anything can read it, `Finisher` takes the job's real result (waiting if the process has
  not finished) and rebuilds the update: the trained model in the task's codec against the same start weights,
  the real loss and training seconds, signed again with the worker's keys.

Nothing that happens before `not_before` depends on the trained model, so the run is event for event the run one
process would make (tests/unit/test_sim_pool.py compares the records). A training is a pure function of its start
weights, the client's data and the task's seed (`fedat_worker.trainer`), so which process trains it does not
matter. Each process builds the run's parts itself from a picklable recipe (TensorFlow is not fork-safe).
"""

from __future__ import annotations

import signal
import zlib
from collections import defaultdict, deque
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, replace
from multiprocessing import get_context

import numpy as np
import pika

from fedat.protocol.service import Outgoing
from fedat.protocol.wire import Update, decode, encode_model
from fedat.runtime import bus, publishing
from fedat_sim.clients import Parts, answer_at_not_before
from fedat_sim.memory import MemoryConnection
from fedat_worker.training import Trainer, TrainResult

Recipe = Callable[[], Parts]  # builds a run's parts; must pickle (a module-level function or a partial of one)

_parts: Parts | None = None  # a pool process's own parts, built once by `_start`


def _start(recipe: Recipe) -> None:
    global _parts
    # The parent ends the pool when its run ends; a signal meant for the run (SIGTERM: stop early) is not ours.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _parts = recipe()


def _train(client: int, weights: list[np.ndarray], kwargs: dict) -> TrainResult:
    assert _parts is not None, "the pool process was not started with a recipe"
    data = _parts.clients[client]
    return _parts.trainer.train(weights, data.x_train, data.y_train, **kwargs)


class PoolBroken(BaseException):
    """A pool process failed or died: the run cannot go on as the run one process makes (a BaseException, so that
    no handler takes it for a failed message and retries it)."""


@dataclass(frozen=True)
class _Job:
    result: Future
    start: list[np.ndarray]


class PoolTrainer(Trainer):
    """Trains in `processes` processes; `train` answers with a stand-in and `finish` gives the real result."""

    def __init__(self, parts: Parts, recipe: Recipe, processes: int):
        if processes < 2:
            raise ValueError(f"a training pool needs at least 2 processes, got {processes}")
        self.parts = parts
        self._client_of = {id(c.x_train): k for k, c in enumerate(parts.clients)}
        self._pool = ProcessPoolExecutor(
            processes, mp_context=get_context("spawn"), initializer=_start, initargs=(recipe,)
        )
        # By (client, seed): a task redelivered after a crash is trained again while its first training may be in
        # flight; both give the same result, and the first update to become visible takes the first.
        self._jobs: dict[tuple[int, int], deque[_Job]] = defaultdict(deque)

    def train(
        self,
        weights: list[np.ndarray],
        x: np.ndarray,
        y: np.ndarray,
        *,
        epochs: int,
        prox_lambda: float,
        seed: int,
        learning_rate: float | None = None,
        batch_size: int | None = None,
    ) -> TrainResult:
        """Send the training to a process; answer with a stand-in (the start weights, loss 0) until `finish`."""
        client = self._client_of.get(id(x))
        if client is None:
            raise ValueError("a pool trains only the run's own clients (x is none of their training splits)")
        kwargs = dict(
            epochs=epochs, prox_lambda=prox_lambda, seed=seed, learning_rate=learning_rate, batch_size=batch_size
        )
        try:
            future = self._pool.submit(_train, client, list(weights), kwargs)
        except BrokenProcessPool as exc:
            raise PoolBroken(f"a training process died: {exc}") from exc
        self._jobs[(client, seed)].append(_Job(future, weights))
        return TrainResult(weights, len(x), 0.0, 0.0)

    def finish(self, client: int, seed: int) -> tuple[TrainResult, list[np.ndarray]]:
        """The real result of the client's training sent with `seed` (waits for it), and the weights it started from."""
        queued = self._jobs.get((client, seed))
        if not queued:
            raise RuntimeError(f"no training of client {client} with seed {seed} is in flight")
        job = queued.popleft()
        if not queued:
            del self._jobs[(client, seed)]
        try:
            return job.result.result(), job.start
        except Exception as exc:
            raise PoolBroken(f"a training (seed {seed}) failed in its process: {type(exc).__name__}: {exc}") from exc

    def evaluate_per_client(
        self, weights: list[np.ndarray], clients: list[tuple[np.ndarray, np.ndarray]], batch_size: int = 1000
    ) -> list[tuple[float, float, int]]:
        """Scored in this process, by the run's own trainer."""
        return self.parts.trainer.evaluate_per_client(weights, clients, batch_size)

    def close(self) -> None:
        """End the processes; trainings nobody will read are dropped."""
        self._jobs.clear()
        self._pool.shutdown(wait=True, cancel_futures=True)


def answer_finished(finisher: Finisher) -> Callable[[MemoryConnection], None]:
    """Configure a worker's connection: updates visible at their `not_before`, rebuilt by `finisher` then."""

    def configure(conn: MemoryConnection) -> None:
        answer_at_not_before(conn)
        conn.finish = finisher

    return configure


class Finisher:
    """Rebuilds a stand-in update with its real training when the broker makes it visible (a worker's hook)."""

    def __init__(self, trainer: PoolTrainer, names: list[str], cfg: bus.BrokerConfig):
        self.trainer, self.names, self.cfg = trainer, names, cfg

    def __call__(
        self, exchange: str, routing_key: str, body: bytes, properties: pika.BasicProperties
    ) -> tuple[bytes, pika.BasicProperties]:
        """The update as the worker would have published it after training in its own process."""
        if properties.type != "update":
            return body, properties
        stand_in = decode(body, Update)
        assert isinstance(stand_in, Update)
        seed = zlib.crc32(stand_in.task_id.encode())  # the seed `local.train` gave the task's training
        result, start = self.trainer.finish(stand_in.client, seed)
        layers = ()
        if stand_in.layers:  # as `local.update` encodes them: the task's codec, against the weights it started from
            codec, precision = stand_in.layers[0].codec, stand_in.layers[0].precision
            layers = encode_model(result.weights, self.names, codec, precision, bases=start)
        update = replace(stand_in, loss=result.loss, train_seconds=result.seconds, layers=layers)
        (sent,) = bus.encode_all([Outgoing(exchange, routing_key, update)], self.cfg)
        return sent.body, publishing.properties(sent.kind, sent.id, dict(sent.headers))

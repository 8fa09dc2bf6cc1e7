"""The evaluator: scores global models on every client's test split (mean accuracy, loss, per-client variance)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from fedat.fl.evaluation import due  # the rule the collector shares
from fedat.protocol import topology
from fedat.protocol.service import Effects, Inbound, Outgoing, Reactive, Subscription, done
from fedat.protocol.wire import Evaluation, GlobalModel, decode_model
from fedat_worker.datasets import ClientData
from fedat_worker.training import Trainer


@dataclass(frozen=True)
class EvaluatorConfig:
    """How often to evaluate: every `every` versions (0: never by count) or `interval` seconds (0: never by time);
    `grid`: by time on a fixed grid (the first version in each `interval`-long slot) instead of `interval` s after
    the last scored version."""

    every: int = 5
    interval: float = 0.0
    grid: bool = False


def score(per_client: list[tuple[float, float, int]]) -> tuple[float, float, float]:
    """(mean accuracy, mean loss, variance of accuracy) over clients, each client counting once."""
    acc = np.array([a for _, a, _ in per_client], dtype=np.float64)
    loss = np.array([lo for lo, _, _ in per_client], dtype=np.float64)
    return float(acc.mean()), float(loss.mean()), float(acc.var())


class Evaluator(Reactive):
    """Evaluates the first global version it sees, then as `due` says: a time interval treats methods alike."""

    name = "evaluator"

    def __init__(
        self,
        cfg: EvaluatorConfig,
        clients: Sequence[ClientData],
        trainer: Trainer,
        clock: Callable[[], float],
        metrics=None,
    ):
        self.cfg, self.trainer, self.clock, self.metrics = cfg, trainer, clock, metrics
        self.tests = [(c.x_test, c.y_test) for c in clients]

    def initial(self) -> tuple[int, float] | None:
        """(version, time) of the last evaluation: none yet. Not persisted: a restart scores the next model it sees."""
        return None

    def subscriptions(self) -> dict[str, Subscription]:
        """Global models (a bounded observer queue: a slow evaluator skips versions, never blocks anyone)."""
        return {topology.EVALUATOR_GLOBAL: Subscription(GlobalModel, self.on_global)}

    def on_global(self, last, inbound: Inbound, now: float, held) -> tuple[tuple[int, float] | None, Effects]:
        """Evaluate when due and publish the scores."""
        g: GlobalModel = inbound.message
        if not due(g.version, now, last, self.cfg.every, self.cfg.interval, self.cfg.grid):
            return last, done(inbound)
        started = self.clock()
        per_client = self.trainer.evaluate_per_client(decode_model(g.layers), self.tests)
        acc, loss, var = score(per_client)
        if self.metrics:
            self.metrics.accuracy.set(acc)
            self.metrics.variance.set(var)
            self.metrics.version.set(g.version)
            self.metrics.seconds.observe(self.clock() - started)
        ev = Evaluation(
            id=f"e{g.version}",
            version=g.version,
            accuracy=acc,
            loss=loss,
            variance=var,
            n_clients=len(self.tests),
            evaluated_at=self.clock(),
            accuracies=tuple(float(a) for _, a, _ in per_client),
        )
        return (g.version, now), done(inbound, Outgoing(topology.EVENTS, topology.EVALUATION_KEY, ev))

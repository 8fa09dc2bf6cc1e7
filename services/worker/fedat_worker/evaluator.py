"""The evaluator: scores global models on every client's test split (mean accuracy, loss, per-client variance)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from fedat import topology
from fedat.service import Effects, Inbound, Outgoing, Reactive, done
from fedat.wire import Evaluation, GlobalModel, decode_model


@dataclass(frozen=True)
class EvaluatorConfig:
    """How often to evaluate."""

    every: int = 5


def score(per_client: list[tuple[float, float, int]]) -> tuple[float, float, float]:
    """(mean accuracy, mean loss, variance of accuracy) over clients, each client counting once."""
    acc = np.array([a for _, a, _ in per_client], dtype=np.float64)
    loss = np.array([lo for lo, _, _ in per_client], dtype=np.float64)
    return float(acc.mean()), float(loss.mean()), float(acc.var())


class Evaluator(Reactive):
    """Evaluates every `every`-th global version (and always the first one it sees)."""

    name = "evaluator"

    def __init__(self, cfg: EvaluatorConfig, clients, trainer, clock: Callable[[], float], metrics=None):
        self.cfg, self.trainer, self.clock, self.metrics = cfg, trainer, clock, metrics
        self.tests = [(c.x_test, c.y_test) for c in clients]
        self.last: int | None = None

    def subscriptions(self) -> dict[str, type]:
        """Global models (a bounded observer queue: a slow evaluator skips versions, never blocks anyone)."""
        return {topology.EVALUATOR_GLOBAL: GlobalModel}

    def handle(self, inbound: Inbound, now: float) -> Effects:
        """Evaluate when due and publish the scores."""
        g: GlobalModel = inbound.message
        if self.last is not None and g.version < self.last + self.cfg.every:
            return done(inbound)
        started = self.clock()
        per_client = self.trainer.evaluate_per_client(decode_model(g.layers), self.tests)
        acc, loss, var = score(per_client)
        self.last = g.version
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
        return done(inbound, Outgoing(topology.EVENTS, topology.EVALUATION_KEY, ev))

"""An app's own training settings (learning rate, batch size, epochs) win over a task's, in every mode.

The task carries the experiment's settings; an app that sets its own knows its model better, so the trainer that
every mode builds from the app (`fedat_worker.workload.model_and_trainer`: real clients, the pool, simulations)
trains with the app's values where it sets them. An app that sets none gets the bare trainer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from fedat.protocol.wire import TrainTask
from fedat_worker.training import Trainer, TrainResult


@dataclass(frozen=True)
class Overrides:
    """Settings that win over the task's; None keeps the task's value."""

    learning_rate: float | None = None
    batch_size: int | None = None
    epochs: int | None = None

    def epochs_of(self, task: TrainTask) -> int:
        """The epochs a task is trained for."""
        return task.epochs if self.epochs is None else self.epochs

    def batch_size_of(self, task: TrainTask) -> int:
        """The mini-batch size a task is trained with."""
        return task.batch_size if self.batch_size is None else self.batch_size


NONE = Overrides()


class Tuned(Trainer):
    """A trainer that trains with the app's settings where the app sets them; scoring is unchanged."""

    def __init__(self, inner: Trainer, overrides: Overrides):
        self.inner, self.overrides = inner, overrides

    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # not set yet (a copy being made): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)  # the inner trainer's model, trace counts, ...

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
        """Train as the task says, with the app's settings in place of the task's where it has them."""
        o = self.overrides
        return self.inner.train(
            weights,
            x,
            y,
            epochs=epochs if o.epochs is None else o.epochs,
            prox_lambda=prox_lambda,
            seed=seed,
            learning_rate=learning_rate if o.learning_rate is None else o.learning_rate,
            batch_size=batch_size if o.batch_size is None else o.batch_size,
        )

    def evaluate_per_client(
        self, weights: list[np.ndarray], clients: list[tuple[np.ndarray, np.ndarray]], batch_size: int = 1000
    ) -> list[tuple[float, float, int]]:
        """The inner trainer's scores."""
        return self.inner.evaluate_per_client(weights, clients, batch_size)


def tuned(trainer: Trainer, overrides: Overrides) -> Trainer:
    """`trainer` with the app's settings winning, or `trainer` itself when the app sets none."""
    return trainer if overrides == NONE else Tuned(trainer, overrides)


def overrides_of(trainer: Trainer) -> Overrides:
    """The settings that win over a task's in this trainer (none for a bare one)."""
    return trainer.overrides if isinstance(trainer, Tuned) else NONE

"""What trains and scores a client's model, as the worker and the evaluator see it (no TensorFlow here)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np


@dataclass(frozen=True)
class TrainResult:
    """Outcome of one local training task."""

    weights: list[np.ndarray]
    n_samples: int
    loss: float
    seconds: float


class Trainer(Protocol):
    """Local training from a global model and per-client scoring: the project's Keras trainer and the simulator's
    numpy stand-in both implement it."""

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
        """Train from `weights` on (x, y) with the proximal term λ/2‖w − weights‖²; the same seed, the same result."""
        ...

    def evaluate_per_client(
        self, weights: list[np.ndarray], clients: list[tuple[np.ndarray, np.ndarray]], batch_size: int = 1000
    ) -> list[tuple[float, float, int]]:
        """(loss, accuracy, samples) of `weights` on each client's (x, y); an empty client gives (nan, nan, 0)."""
        ...

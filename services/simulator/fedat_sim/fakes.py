"""A numpy-only stand-in for the trainer and the data, for simulation tests that must run hundreds of seeds fast.

Each client's data is a constant target; "training" moves the weights towards it by a step that depends on the
epochs, and "scoring" measures how close the model is to every client's target. Both are pure functions of their
inputs (and the task seed), so the services see real, changing models without TensorFlow.
"""

from __future__ import annotations

import numpy as np

from fedat_sim.clients import Parts
from fedat_worker.datasets import ClientData
from fedat_worker.training import Trainer, TrainResult

SHAPES = ((6, 4), (4,))
# The "measured" seconds per mini-batch step the stand-in reports (a CNN step on one core is ~0.006 s). Never 0:
# with `step_seconds` unset the latency model uses the measured time, and a zero-delay group would then answer in
# zero virtual time, so its rounds would close forever at one instant (the smoke experiments' first delay group).
STEP_SECONDS = 0.005


class FakeTrainer(Trainer):
    """Moves the weights towards the client's target; scores by distance to each client's target."""

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
        """A deterministic local step: w + (1 - 0.5^epochs) (target - w), plus seeded noise; timed as
        epochs × ceil(n / batch) × STEP_SECONDS."""
        target = float(x.mean())
        step = 1.0 - 0.5**epochs
        rng = np.random.default_rng(seed)
        out = [(w + step * (target - w) + rng.normal(0.0, 0.01, w.shape)).astype(np.float32) for w in weights]
        loss = float(np.mean([np.mean((w - target) ** 2) for w in weights]))
        steps = epochs * -(-len(x) // (batch_size or 10))
        return TrainResult(out, len(x), loss, steps * STEP_SECONDS)

    def evaluate_per_client(
        self, weights: list[np.ndarray], clients: list[tuple[np.ndarray, np.ndarray]], batch_size: int = 1000
    ) -> list[tuple[float, float, int]]:
        """(loss, accuracy, n) per client: accuracy 1 / (1 + distance to the client's target)."""
        mean = float(np.mean(np.concatenate([w.ravel() for w in weights])))
        out = []
        for x, _ in clients:
            d = abs(mean - float(x.mean()))
            out.append((d * d, 1.0 / (1.0 + d), len(x)))
        return out


def fake_parts(num_clients: int, samples: int = 20, seed: int = 0) -> Parts:
    """Clients with constant targets in [-1, 1] (two classes each, like a shard split) and a zero initial model."""
    rng = np.random.default_rng([seed, 0xFA4E])
    clients = []
    for _ in range(num_clients):
        target = np.float32(rng.uniform(-1.0, 1.0))
        x = np.full((samples, 2), target, np.float32)
        y = rng.integers(0, 2, samples)
        clients.append(ClientData(x, y, x[: max(1, samples // 4)], y[: max(1, samples // 4)]))
    initial = tuple(np.zeros(s, np.float32) for s in SHAPES)
    return Parts(tuple(clients), FakeTrainer(), tuple(f"layer{i}" for i in range(len(SHAPES))), initial)

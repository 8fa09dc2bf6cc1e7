"""Messages the tests play: the seed model and a client's answer to a task."""

from __future__ import annotations

import numpy as np

from fedat.protocol.wire import GlobalModel, TrainTask, Update, encode_model, seed_model

SHAPES = [(3, 2), (2,)]


def seed(tiers: int, shapes=SHAPES, now: float = 0.0) -> GlobalModel:
    """A zero w0 with the given layer shapes, raw-coded so that merges can be checked exactly."""
    w0 = [np.zeros(s, np.float32) for s in shapes]
    return seed_model(w0, [f"layer{i}" for i in range(len(shapes))], tiers, "raw", 4, now)


def answer(task: TrainTask, value: float, n: int = 1, not_before: float = 0.0) -> Update:
    """A client's update for `task`: every weight equal to `value`, trained on n samples."""
    weights = [np.full(layer.shape, value, np.float32) for layer in task.layers]
    return Update(
        id=f"u-{task.id}",
        task_id=task.id,
        client=task.client,
        tier=task.tier,
        round=task.round,
        base_version=task.version,
        n_samples=n,
        loss=0.5,
        dispatched_at=task.sent_at,
        started_at=task.sent_at,
        finished_at=task.sent_at,
        train_seconds=0.01,
        not_before=not_before,
        late=False,
        layers=encode_model(weights, [layer.name for layer in task.layers], task.codec, task.precision),
    )

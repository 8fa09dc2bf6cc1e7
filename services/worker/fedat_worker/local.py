"""One task trained locally: its model checked and decoded, trained on one client's data, the update built.

Shared by the pool worker (any logical client; `not_before` from the latency model) and a real client (its own data;
`not_before` = 0). No TensorFlow here: the trainer does the training.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence

import numpy as np

from fedat.protocol import topology
from fedat.protocol.service import Reject
from fedat.protocol.wire import Layer, TrainTask, Update, WireError, decode_model, encode_model
from fedat_worker.datasets import ClientData
from fedat_worker.training import Trainer, TrainResult


def start_weights(
    task: TrainTask,
    initial: list[np.ndarray],
    shapes: list[tuple[int, ...]],
    model: str = "the model's",
    kept: Mapping[int, Sequence[np.ndarray]] | None = None,
) -> list[np.ndarray]:
    """The weights a task starts from: its decoded model (against the version it names, from `kept`, the global
    models this receiver keeps by version), or `initial` for a profiling task (no layers)."""
    if not task.layers:
        return initial  # a profiling task: train from the initial model
    bases = None
    if task.relative_to >= 0:
        bases = (kept or {}).get(task.relative_to)
        if bases is None:
            keeps = f"it keeps versions {sorted(kept)}" if kept else "it keeps none"
            raise Reject(
                f"task {task.id} is sent against global version {task.relative_to}, which this receiver does not "
                f"keep ({keeps}); a task it cannot answer in time makes the barrier send the next one whole"
            )
    return checked_weights(task.layers, f"task {task.id}", shapes, model, bases)


def checked_weights(
    layers: Sequence[Layer],
    what: str,
    shapes: list[tuple[int, ...]],
    model: str = "the model's",
    bases: Sequence[np.ndarray] | None = None,
) -> list[np.ndarray]:
    """Decode a received model whose layer shapes are `shapes`; Reject names both when they differ."""
    # Shapes first: a layer that claims more values than the model has is refused before it is inflated.
    got = [layer.shape for layer in layers]
    if got != shapes:
        raise Reject(f"{what}: layer shapes {got} do not match {model} {shapes}")
    try:
        return decode_model(layers, bases)
    except WireError as exc:
        raise Reject(f"{what}: {exc}") from None


def train(trainer: Trainer, task: TrainTask, weights: list[np.ndarray], data: ClientData) -> TrainResult:
    """Train `weights` on the client's training split as the task says; seeded by the task's id."""
    return trainer.train(
        weights,
        data.x_train,
        data.y_train,
        epochs=task.epochs,
        prox_lambda=task.prox_lambda,
        seed=zlib.crc32(task.id.encode()),
        learning_rate=task.learning_rate,
        batch_size=task.batch_size,
    )


def update(
    task: TrainTask,
    result: TrainResult,
    start: list[np.ndarray],
    names: list[str],
    started: float,
    finished: float,
    not_before: float,
    late: bool,
) -> Update:
    """The answer to `task`: its trained model in the task's codec (none for a profiling task, which is only timed)."""
    return Update(
        id=f"u-{task.id}",
        task_id=task.id,
        client=task.client,
        tier=task.tier,
        round=task.round,
        base_version=task.version,
        n_samples=result.n_samples,
        loss=result.loss,
        dispatched_at=task.sent_at,
        started_at=started,
        finished_at=finished,
        train_seconds=result.seconds,
        not_before=not_before,
        late=late,
        # A profiling answer is only timed: its model would be thrown away, so it is not sent. A relative codec
        # sends the difference from the task's model exactly as decoded here, which the barrier decodes alike.
        layers=encode_model(result.weights, names, task.codec, task.precision, bases=start) if task.tier else (),
    )


def answer_key(task: TrainTask) -> str:
    """The results exchange's routing key of a task's answer: its tier's, or the profiling key for tier 0."""
    return topology.tier_key(task.tier) if task.tier else topology.PROFILE_KEY

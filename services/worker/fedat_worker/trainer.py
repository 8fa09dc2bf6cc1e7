"""Local client training (FedAvg / FedProx objective) around one long-lived Keras model."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import tensorflow as tf
from tensorflow import keras

from fedat.protocol.service import Interrupted
from fedat_worker.training import Trainer, TrainResult


class LocalTrainer(Trainer):
    """Trains one model for many clients, reusing one compiled train function and one optimizer.

    The compiled function runs a whole epoch (a graph while-loop over mini-batches), which removes
    the per-step Python dispatch cost of a step loop. It is traced once per process
    (`trace_count == 1`): its input signature has a `None` batch dimension, so client sizes and a
    partial last batch never retrace, and λ and the global-weight anchor live in variables.
    """

    def __init__(
        self,
        model: keras.Model,
        *,
        learning_rate: float = 1e-3,
        batch_size: int = 10,
        stopping: Callable[[], bool] = lambda: False,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.model = model
        # Checked between epochs, so a stopping process gives its task back within one epoch, not one task.
        self.stopping = stopping
        self.batch_size = int(batch_size)
        self.trace_count = 0
        self.eval_trace_count = 0

        self._weights = list(model.weights)
        self._trainable = list(model.trainable_variables)
        self._names = [v.path for v in self._weights]
        self._input_shape = tuple(model.input_shape[1:])
        self._x_dtype = tf.as_dtype(model.inputs[0].dtype)
        x_spec = tf.TensorSpec((None, *self._input_shape), self._x_dtype)
        y_spec = tf.TensorSpec((None,), tf.int32)

        self._optimizer = keras.optimizers.Adam(learning_rate=learning_rate)
        self._optimizer.build(self._trainable)
        # Fresh-optimizer snapshot (iterations 0, zero moments, the learning rate) restored per task,
        # so every client starts with a new Adam without creating variables or retracing.
        self._opt_vars = list(self._optimizer.variables)
        self._opt_fresh = [v.numpy() for v in self._opt_vars]

        # Dropout RNG state is not part of the weights; reseeding it per task makes a task
        # reproducible from (weights, data, seed) alone.
        weight_ids = {id(v) for v in self._weights}
        self._rng_states = [
            (v, int(v.numpy()[0]))
            for v in model.variables
            if id(v) not in weight_ids and "seed_generator_state" in v.path
        ]

        self._anchor = [
            tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False, name=f"anchor_{i}")
            for i, v in enumerate(self._trainable)
        ]
        self._prox_lambda = tf.Variable(0.0, dtype=tf.float32, trainable=False, name="prox_lambda")
        # A variable, not a Python int, so that a task's own batch size needs no retrace.
        self._batch = tf.Variable(self.batch_size, dtype=tf.int32, trainable=False, name="batch_size")

        self._train_epoch = tf.function(self._train_epoch_impl, input_signature=[x_spec, y_spec])
        self._eval_step = tf.function(self._eval_step_impl, input_signature=[x_spec, y_spec])

    # -- compiled bodies ----------------------------------------------------------------------------

    def _train_epoch_impl(self, x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        self.trace_count += 1  # Python side effect: runs only while tracing
        bs = self._batch.read_value()
        n = tf.shape(x)[0]
        total = tf.constant(0.0, tf.float32)
        for lo in tf.range(0, n, bs):
            xb, yb = x[lo : lo + bs], y[lo : lo + bs]
            with tf.GradientTape() as tape:
                logits = tf.cast(self.model(xb, training=True), tf.float32)
                ce = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=yb, logits=logits))
                pairs = zip(self._trainable, self._anchor, strict=True)
                prox = tf.add_n([tf.reduce_sum(tf.square(v - a)) for v, a in pairs])
                objective = ce + 0.5 * self._prox_lambda * prox
            grads = tape.gradient(objective, self._trainable)
            self._optimizer.apply_gradients(zip(grads, self._trainable, strict=True))
            total += ce * tf.cast(tf.shape(yb)[0], tf.float32)
        return total / tf.cast(n, tf.float32)

    def _eval_step_impl(self, x: tf.Tensor, y: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        self.eval_trace_count += 1
        logits = tf.cast(self.model(x, training=False), tf.float32)
        loss = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits)
        correct = tf.cast(tf.equal(tf.argmax(logits, axis=-1, output_type=tf.int32), y), tf.float32)
        return loss, correct

    # -- helpers ------------------------------------------------------------------------------------

    def _set_weights(self, weights: list[np.ndarray]) -> None:
        if len(weights) != len(self._weights):
            raise ValueError(f"expected {len(self._weights)} weight tensors, got {len(weights)}")
        arrays = []
        for i, (var, w) in enumerate(zip(self._weights, weights, strict=True)):
            arr = np.asarray(w)
            want, got = tuple(var.shape), tuple(arr.shape)
            if got != want:
                raise ValueError(f"weight {i} ({self._names[i]}): expected shape {want}, got {got}")
            arrays.append(arr.astype(var.dtype, copy=False))
        # Validate everything before assigning so a bad list never leaves the model half-updated.
        for var, arr in zip(self._weights, arrays, strict=True):
            var.assign(arr)

    def _get_weights(self) -> list[np.ndarray]:
        return [np.array(v.numpy(), dtype=np.float32, copy=True) for v in self._weights]

    def _check_xy(self, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        x = np.asarray(x, dtype=self._x_dtype.as_numpy_dtype)
        y = np.asarray(y).astype(np.int32, copy=False).reshape(-1)
        if len(x) == 0:
            raise ValueError("x has 0 samples")
        if tuple(x.shape[1:]) != self._input_shape:
            raise ValueError(f"x samples have shape {tuple(x.shape[1:])}, model expects {self._input_shape}")
        if len(x) != len(y):
            raise ValueError(f"x has {len(x)} samples but y has {len(y)}")
        return x, y

    def _reset_task_state(self, seed: int) -> None:
        for v, fresh in zip(self._opt_vars, self._opt_fresh, strict=True):
            v.assign(fresh)
        for v, initial in self._rng_states:
            mixed = int(np.random.SeedSequence([initial, seed]).generate_state(1)[0])
            v.assign(np.array([mixed, 0], dtype=v.dtype))

    # -- public API ---------------------------------------------------------------------------------

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
        """Train from global `weights` on (x, y) with a fresh Adam and the FedProx term; Interrupted if stopping."""
        start = time.perf_counter()
        x, y = self._check_xy(x, y)
        if epochs < 1:
            raise ValueError(f"epochs must be >= 1, got {epochs}")
        if not prox_lambda >= 0:
            raise ValueError(f"prox_lambda must be >= 0, got {prox_lambda}")
        if learning_rate is not None and not learning_rate > 0:
            raise ValueError(f"learning_rate must be > 0, got {learning_rate}")
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self._set_weights(weights)
        self._batch.assign(self.batch_size if batch_size is None else int(batch_size))
        for a, v in zip(self._anchor, self._trainable, strict=True):
            a.assign(v)
        self._prox_lambda.assign(float(prox_lambda))
        self._reset_task_state(seed)
        if learning_rate is not None:
            # The rate is an optimizer variable, so a per-task value needs no retrace.
            self._optimizer.learning_rate = float(learning_rate)

        rng = np.random.default_rng(seed)
        loss = float("nan")
        for _ in range(epochs):
            if self.stopping():
                raise Interrupted("the process is stopping")
            perm = rng.permutation(len(x))
            loss = float(self._train_epoch(x[perm], y[perm]))
        return TrainResult(
            weights=self._get_weights(), n_samples=len(x), loss=loss, seconds=time.perf_counter() - start
        )

    def _per_sample(self, x: np.ndarray, y: np.ndarray, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        losses, corrects = [], []
        for lo in range(0, len(x), batch_size):
            loss, correct = self._eval_step(x[lo : lo + batch_size], y[lo : lo + batch_size])
            losses.append(loss.numpy())
            corrects.append(correct.numpy())
        return np.concatenate(losses), np.concatenate(corrects)

    def evaluate(
        self, weights: list[np.ndarray], x: np.ndarray, y: np.ndarray, batch_size: int = 1000
    ) -> tuple[float, float]:
        """Mean cross-entropy and accuracy of `weights` on (x, y)."""
        x, y = self._check_xy(x, y)
        self._set_weights(weights)
        loss, correct = self._per_sample(x, y, batch_size)
        return float(loss.mean()), float(correct.mean())

    def evaluate_per_client(
        self, weights: list[np.ndarray], clients: list[tuple[np.ndarray, np.ndarray]], batch_size: int = 1000
    ) -> list[tuple[float, float, int]]:
        """(loss, accuracy, n) per client from one batched pass; empty clients give (nan, nan, 0)."""
        checked = [self._check_xy(cx, cy) if len(cx) > 0 else None for cx, cy in clients]
        self._set_weights(weights)
        nonempty = [c for c in checked if c is not None]
        if not nonempty:
            return [(float("nan"), float("nan"), 0) for _ in clients]
        loss, correct = self._per_sample(
            np.concatenate([cx for cx, _ in nonempty]), np.concatenate([cy for _, cy in nonempty]), batch_size
        )
        out: list[tuple[float, float, int]] = []
        lo = 0
        for c in checked:
            if c is None:
                out.append((float("nan"), float("nan"), 0))
                continue
            n = len(c[0])
            out.append((float(loss[lo : lo + n].mean()), float(correct[lo : lo + n].mean()), n))
            lo += n
        return out

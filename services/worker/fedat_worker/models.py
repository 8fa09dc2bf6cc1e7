"""Model zoo for FedAT workers: the paper's CNN, logistic regression and the Reddit LSTM."""

from __future__ import annotations

from collections.abc import Callable

import tensorflow as tf
from tensorflow import keras

# Hidden size of the Reddit LSTM; matches the embedding width.
LSTM_UNITS = 128
LSTM_VOCAB = 10_000
LSTM_EMBED = 128


class _Seeds:
    """Hands out a distinct, reproducible initializer seed per weight tensor."""

    def __init__(self, seed: int) -> None:
        if seed < 0:
            raise ValueError(f"seed must be >= 0, got {seed}")
        # Room for 1000 weight tensors per model keeps (seed, index) pairs collision-free.
        self._base = seed * 1000
        self._next = 0

    def __call__(self) -> int:
        self._next += 1
        return self._base + self._next

    def glorot(self) -> keras.initializers.Initializer:
        return keras.initializers.GlorotUniform(seed=self())


def _cnn(input_shape: tuple[int, ...], num_classes: int, s: _Seeds) -> keras.Model:
    L = keras.layers
    return keras.Sequential(
        [
            keras.Input(shape=input_shape, dtype="float32"),
            L.Conv2D(32, 3, activation="relu", kernel_initializer=s.glorot(), name="conv1"),
            L.MaxPooling2D(2, name="pool1"),
            L.Conv2D(64, 3, activation="relu", kernel_initializer=s.glorot(), name="conv2"),
            L.MaxPooling2D(2, name="pool2"),
            L.Conv2D(64, 3, activation="relu", kernel_initializer=s.glorot(), name="conv3"),
            L.Flatten(name="flatten"),
            L.Dense(64, activation="relu", kernel_initializer=s.glorot(), name="fc1"),
            L.Dense(num_classes, kernel_initializer=s.glorot(), name="logits"),
        ],
        name="cnn",
    )


def _logreg(input_shape: tuple[int, ...], num_classes: int, s: _Seeds) -> keras.Model:
    L = keras.layers
    return keras.Sequential(
        [
            keras.Input(shape=input_shape, dtype="float32"),
            L.Flatten(name="flatten"),
            L.Dense(num_classes, kernel_initializer=s.glorot(), name="logits"),
        ],
        name="logreg",
    )


def _lstm(input_shape: tuple[int, ...], num_classes: int, s: _Seeds) -> keras.Model:
    L = keras.layers
    return keras.Sequential(
        [
            keras.Input(shape=input_shape, dtype="int32"),
            L.Embedding(
                LSTM_VOCAB,
                LSTM_EMBED,
                embeddings_initializer=keras.initializers.RandomUniform(-0.05, 0.05, seed=s()),
                name="embedding",
            ),
            L.LSTM(
                LSTM_UNITS,
                dropout=0.1,
                kernel_initializer=s.glorot(),
                recurrent_initializer=keras.initializers.Orthogonal(seed=s()),
                # Dropout masks draw from this generator; seeding it keeps runs reproducible.
                seed=s(),
                name="lstm",
            ),
            L.BatchNormalization(name="bn"),
            L.Dense(num_classes, kernel_initializer=s.glorot(), name="logits"),
        ],
        name="lstm",
    )


MODELS: dict[str, Callable[[tuple[int, ...], int, _Seeds], keras.Model]] = {
    "cnn": _cnn,
    "logreg": _logreg,
    "lstm": _lstm,
}


def build_model(name: str, input_shape: tuple[int, ...], num_classes: int, seed: int = 0) -> keras.Model:
    """Build a registered model with weights fully determined by `seed`."""
    try:
        factory = MODELS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; known: {sorted(MODELS)}") from None
    return factory(tuple(int(d) for d in input_shape), int(num_classes), _Seeds(int(seed)))


def weight_names(model: keras.Model) -> list[str]:
    """Stable wire names of the model's weight tensors, in `model.get_weights()` order."""
    names = [v.path for v in model.weights]
    if len(set(names)) != len(names):
        raise ValueError(f"model {model.name!r} has duplicate weight names: {names}")
    return names


def configure_threads(n: int) -> None:
    """Set TF intra- and inter-op threads to `n`; a no-op when already set to `n`."""
    if n < 1:
        raise ValueError(f"thread count must be >= 1, got {n}")
    cfg = tf.config.threading
    if cfg.get_intra_op_parallelism_threads() == n and cfg.get_inter_op_parallelism_threads() == n:
        return
    try:
        cfg.set_intra_op_parallelism_threads(n)
        cfg.set_inter_op_parallelism_threads(n)
    except RuntimeError as e:
        raise RuntimeError(
            f"cannot set TensorFlow threads to {n}: the runtime is already initialised "
            "(call configure_threads before building models or running any op)"
        ) from e

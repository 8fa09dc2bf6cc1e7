"""Small apps for the client's tests: a good one, and ones that each get one thing wrong."""

from __future__ import annotations

import numpy as np

from fedat_worker.app import App, Context

FEATURES, CLASSES = 4, 3


def model(ctx: Context, outputs: int = CLASSES, features: int = FEATURES):
    """A dense softmax-free classifier, its weights set by the seed."""
    from tensorflow import keras

    init = keras.initializers.GlorotUniform(seed=ctx.seed + 1)
    return keras.Sequential(
        [
            keras.Input(shape=(features,), dtype="float32"),
            keras.layers.Dense(8, activation="relu", kernel_initializer=init, name="hidden"),
            keras.layers.Dense(outputs, kernel_initializer=init, name="logits"),
        ]
    )


def data(ctx: Context, top: int = CLASSES - 1):
    """Client k's own separable data: the label is the argmax of the first three features."""
    rng = np.random.default_rng(ctx.client)
    x = rng.normal(size=(60, FEATURES)).astype(np.float32)
    y = np.minimum(np.argmax(x[:, :CLASSES], axis=1), top).astype(np.int64)
    y[-1] = top  # so the highest label is present
    return (x[:40], y[:40]), (x[40:], y[40:])


def sequence_model(ctx: Context):
    """Outputs per time step, not per sample: (batch, 2, classes)."""
    from tensorflow import keras

    return keras.Sequential([keras.Input(shape=(FEATURES,)), keras.layers.Reshape((2, 2)), keras.layers.Dense(CLASSES)])


good = App(model=model, data=data)
tuned = App(model=model, data=data, learning_rate=0.05, batch_size=5, epochs=3)  # the app's settings win
wrong_output = App(model=sequence_model, data=data)
too_few_outputs = App(model=lambda ctx: model(ctx, outputs=2), data=data)  # labels go up to 2
wrong_inputs = App(model=lambda ctx: model(ctx, features=5), data=data)
negative_labels = App(
    model=model, data=lambda ctx: ((np.zeros((3, 4)), np.array([0, -1, 1])), (np.zeros((0, 4)), np.zeros(0, int)))
)
bigger = App(model=lambda ctx: model(ctx, outputs=5), data=data)  # a different model from the federation's
not_an_app = {"model": model, "data": data}

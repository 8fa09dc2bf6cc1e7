"""The digits app: a small Keras classifier, and this client's own 8x8 digits.

A real client reads only its own shard, `digits.npz` in the folder FEDAT_DATA_ROOT names (written by
`python -m fedat_digits.shards`). Without FEDAT_DATA_ROOT (a simulation, or a pool of workers) client k's shard is cut
from scikit-learn's bundled set in memory, the same way, for FEDAT_NUM_CLIENTS clients.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fedat_worker.app import App, Context


def model(ctx: Context):
    """64 pixels -> 32 hidden units -> 10 digits; the experiment's seed sets the initial weights."""
    from tensorflow import keras

    return keras.Sequential(
        [
            keras.Input(shape=(64,)),
            keras.layers.Dense(32, activation="relu", kernel_initializer=keras.initializers.GlorotUniform(ctx.seed)),
            keras.layers.Dense(10, kernel_initializer=keras.initializers.GlorotUniform(ctx.seed + 1)),
        ]
    )


def data(ctx: Context):
    """This client's ((x_train, y_train), (x_test, y_test))."""
    root = ctx.settings.get("FEDAT_DATA_ROOT")
    if root:
        with np.load(Path(root) / "digits.npz") as f:
            return (f["x_train"], f["y_train"]), (f["x_test"], f["y_test"])
    from fedat_digits.shards import shard

    return shard(ctx.client, ctx.num_clients, ctx.seed)


app = App(model=model, data=data, batch_size=16)  # optional defaults: they win over the experiment's

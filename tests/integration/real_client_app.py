"""The real-client test's app: each client reads only its own shard, `shard.npz` in the folder FEDAT_DATA_ROOT names.

Six classes of points in 16 dimensions, each a Gaussian cluster; client k holds three of them (k, k+1, k+2 mod 6),
so no client sees every class and the global model learns them only through federation. Small on purpose: the test
times processes, not learning.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fedat_worker.app import App, Context

FEATURES, CLASSES, PER_CLIENT = 16, 6, 3
SAMPLES = 120  # per client; a quarter is its own test split


def model(ctx: Context):
    """16 -> 16 -> 6; the experiment's seed sets the initial weights."""
    from tensorflow import keras

    return keras.Sequential(
        [
            keras.Input(shape=(FEATURES,)),
            keras.layers.Dense(16, activation="relu", kernel_initializer=keras.initializers.GlorotUniform(ctx.seed)),
            keras.layers.Dense(CLASSES, kernel_initializer=keras.initializers.GlorotUniform(ctx.seed + 1)),
        ]
    )


def data(ctx: Context):
    """This client's own ((x_train, y_train), (x_test, y_test)), and nothing else."""
    with np.load(Path(ctx.settings["FEDAT_DATA_ROOT"]) / "shard.npz") as f:
        return (f["x_train"], f["y_train"]), (f["x_test"], f["y_test"])


def write_shard(client: int, folder: Path, seed: int = 0) -> None:
    """Client `client`'s shard into `folder`/shard.npz (the same cluster centres for every client)."""
    centres = np.random.default_rng(seed).normal(0.0, 1.0, (CLASSES, FEATURES)) * 1.5
    rng = np.random.default_rng([seed, client])
    labels = np.array([(client + j) % CLASSES for j in range(PER_CLIENT)])[rng.integers(0, PER_CLIENT, SAMPLES)]
    x = (centres[labels] + rng.normal(0.0, 1.0, (SAMPLES, FEATURES))).astype(np.float32)
    cut = SAMPLES * 3 // 4
    folder.mkdir(parents=True, exist_ok=True)
    np.savez(folder / "shard.npz", x_train=x[:cut], y_train=labels[:cut], x_test=x[cut:], y_test=labels[cut:])


app = App(model=model, data=data)

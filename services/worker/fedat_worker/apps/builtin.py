"""The project's own workloads as an app: a built-in data set split across the clients, and a built-in model.

Its options are the experiment settings FEDAT_DATASET (fashion-mnist, mnist, tweets, cifar10), FEDAT_DATA_ROOT,
FEDAT_MODEL (cnn, logreg, lstm), FEDAT_PARTITION (shards, iid, dirichlet), FEDAT_CLASSES_PER_CLIENT,
FEDAT_DIRICHLET_ALPHA and FEDAT_SAMPLES_PER_CLIENT. The data set is loaded and split once per process; every
client's data is a view into that one split (`fedat_worker.partition.federate`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Any

from fedat.errors import ConfigError
from fedat.runtime import config
from fedat_worker.app import App, Context
from fedat_worker.datasets import LOADERS, ClientData
from fedat_worker.partition import federate


@dataclass(frozen=True)
class Builtin:
    """Which data set, split and model."""

    dataset: str = "fashion-mnist"
    data_root: str = ""
    model: str = "cnn"
    scheme: str = "shards"
    classes_per_client: int = 2
    alpha: float = 0.5
    samples_per_client: int = 0  # 0 = all; a cap keeps tests small


def options(ctx: Context) -> Builtin:
    """The app's options from the experiment's FEDAT_* variables."""
    env, d = ctx.settings, Builtin()
    return Builtin(
        dataset=config.get_str(env, "FEDAT_DATASET", d.dataset),
        data_root=config.get_str(env, "FEDAT_DATA_ROOT", d.data_root),
        model=config.get_str(env, "FEDAT_MODEL", d.model),
        scheme=config.get_str(env, "FEDAT_PARTITION", d.scheme),
        classes_per_client=config.get_int(env, "FEDAT_CLASSES_PER_CLIENT", d.classes_per_client),
        alpha=config.get_float(env, "FEDAT_DIRICHLET_ALPHA", d.alpha),
        samples_per_client=config.get_int(env, "FEDAT_SAMPLES_PER_CLIENT", d.samples_per_client),
    )


def _cap(c: ClientData, n: int) -> ClientData:
    test = max(1, n // 4)
    return replace(c, x_train=c.x_train[:n], y_train=c.y_train[:n], x_test=c.x_test[:test], y_test=c.y_test[:test])


@functools.cache
def split(o: Builtin, num_clients: int, seed: int) -> tuple[tuple[ClientData, ...], int]:
    """Every client's data and the number of classes, loaded and split once per process."""
    if o.dataset not in LOADERS:
        raise ConfigError(f"FEDAT_DATASET={o.dataset!r} is not one of {sorted(LOADERS)}")
    if num_clients < 1:
        raise ConfigError("the built-in app splits a data set across FEDAT_NUM_CLIENTS clients: set it (>= 1)")
    ds = LOADERS[o.dataset](o.data_root) if o.data_root else LOADERS[o.dataset]()
    clients = federate(
        ds, scheme=o.scheme, num_clients=num_clients, seed=seed, classes_per_client=o.classes_per_client, alpha=o.alpha
    )
    if o.samples_per_client:
        clients = [_cap(c, o.samples_per_client) for c in clients]
    return tuple(clients), ds.num_classes


def data(ctx: Context) -> ClientData:
    """Client `ctx.client`'s share of the split."""
    clients, _ = split(options(ctx), ctx.num_clients, ctx.seed)
    if not 0 <= ctx.client < len(clients):
        raise ConfigError(f"client {ctx.client} is not one of the {len(clients)} clients of the built-in split")
    return clients[ctx.client]


def model(ctx: Context) -> Any:
    """The built-in model for the data set's input shape and classes; its weights are set by the seed alone."""
    from fedat_worker.models import build_model

    o = options(ctx)
    clients, num_classes = split(o, ctx.num_clients, ctx.seed)
    return build_model(o.model, tuple(clients[0].x_train.shape[1:]), num_classes, seed=ctx.seed)


app = App(model=model, data=data)

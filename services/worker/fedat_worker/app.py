"""A federated app: the user's Keras model and how one client loads its own data, named as `package.module:attr`.

An app is one Python module a team writes (the README has a complete example). The same app runs unchanged as
real clients (`fedat-client`, one process per client, each loading only its own data), in a pool of workers that
train logical clients (`fedat-worker`), and under `fedat simulate`. The built-in workloads (the paper's CNN on
Fashion-MNIST, logistic regression on tweets, ...) are apps of this same interface (`fedat_worker.apps.builtin`).
Nothing here imports TensorFlow: the app's own module does.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedat.errors import AppError
from fedat_worker.datasets import ClientData

DEFAULT_APP = "fedat_worker.apps.builtin:app"


@dataclass(frozen=True)
class Context:
    """What an app is told about where it runs."""

    client: int  # this client's id (-1 where no client is meant: the seed job only builds the model)
    seed: int  # the experiment's seed: the seed job's model is w0, and data splits may use it
    num_clients: int = 0  # clients of the experiment when they are known in advance (a pool, a simulation); else 0
    settings: Mapping[str, str] = field(default_factory=dict)  # the FEDAT_* variables, for the app's own options


@dataclass(frozen=True)
class App:
    """The model builder, the data loader and the app's defaults (None: the experiment's settings decide)."""

    model: Callable[[Context], Any]  # a fresh keras.Model; built by the seed job with the experiment's seed: w0
    data: Callable[[Context], Any]  # this client's ClientData, or ((x_train, y_train), (x_test, y_test))
    learning_rate: float | None = None
    batch_size: int | None = None
    epochs: int | None = None


def load_app(ref: str) -> App:
    """Import `package.module:attr` and return its App; AppError names what is missing or wrong."""
    module_name, sep, attr = ref.partition(":")
    if not sep or not module_name or not attr:
        raise AppError(f"app {ref!r}: expected `package.module:attr`, e.g. `my_app:app`")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise AppError(f"app {ref!r}: cannot import {module_name!r} ({exc})") from None
    if not hasattr(module, attr):
        raise AppError(f"app {ref!r}: module {module_name!r} has no attribute {attr!r}")
    app = getattr(module, attr)
    if not isinstance(app, App):
        raise AppError(f"app {ref!r}: {attr!r} is a {type(app).__name__}, not a fedat_worker.app.App")
    for part in ("model", "data"):
        if not callable(getattr(app, part)):
            raise AppError(f"app {ref!r}: its {part} must be callable (Context -> ...)")
    for option in ("learning_rate", "batch_size", "epochs"):
        value = getattr(app, option)
        if value is not None and not value > 0:
            raise AppError(f"app {ref!r}: {option} must be > 0 or None, got {value!r}")
    return app


def client_data(app: App, ctx: Context) -> ClientData:
    """This client's data from the app, checked: float or int features, 1-D integer labels of matching length."""
    raw = app.data(ctx)
    if isinstance(raw, ClientData):
        data = raw
    else:
        try:
            (x_train, y_train), (x_test, y_test) = raw
        except (TypeError, ValueError):
            raise AppError(
                f"client {ctx.client}: data() must return a ClientData or ((x_train, y_train), (x_test, y_test)), "
                f"got {type(raw).__name__}"
            ) from None
        data = ClientData(*(np.asarray(a) for a in (x_train, y_train, x_test, y_test)))
    for split, x, y in (("train", data.x_train, data.y_train), ("test", data.x_test, data.y_test)):
        if y.ndim != 1 or not np.issubdtype(y.dtype, np.integer):
            raise AppError(f"client {ctx.client}: {split} labels must be a 1-D integer array, got {y.dtype} {y.shape}")
        if len(x) != len(y):
            raise AppError(f"client {ctx.client}: {len(x)} {split} samples but {len(y)} labels")
        if y.size and y.min() < 0:
            raise AppError(f"client {ctx.client}: {split} labels must be >= 0, got {int(y.min())}")
    if data.n_train < 1:
        raise AppError(f"client {ctx.client}: no training samples")
    return data


def check_model(model: Any, data: ClientData, who: str) -> None:
    """The model takes this data and has an output per class its labels name; AppError says what does not fit."""
    shape = tuple(model.input_shape[1:])
    if tuple(data.x_train.shape[1:]) != shape:
        raise AppError(f"{who}: the model takes inputs of shape {shape}, the data has {tuple(data.x_train.shape[1:])}")
    out = model.output_shape
    if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[-1], int)):
        # One logit per class per sample is what training and scoring assume (sparse cross-entropy, argmax).
        raise AppError(f"{who}: the model's output must have shape (batch, classes), got {out}")
    outputs = int(out[-1])
    top = max(int(data.y_train.max(initial=0)), int(data.y_test.max(initial=0)))
    if top >= outputs:
        raise AppError(f"{who}: labels go up to {top} but the model has {outputs} outputs (labels must be < outputs)")

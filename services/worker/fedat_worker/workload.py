"""What a pool process holds: an app and every logical client's data, built once from the experiment's settings."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from fedat.runtime import config
from fedat_worker.app import DEFAULT_APP, App, Context, check_model, client_data, load_app
from fedat_worker.datasets import ClientData
from fedat_worker.tuned import Overrides, tuned


@dataclass(frozen=True)
class Workload:
    """The app and the clients it serves; identical in every process of one experiment (deterministic by seed)."""

    app: str = DEFAULT_APP
    num_clients: int = 100
    seed: int = 0
    settings: tuple[tuple[str, str], ...] = ()  # the FEDAT_* variables, which the app may read

    def context(self, client: int) -> Context:
        """The app's view of client `client` of this workload (-1: no client, the model only)."""
        return Context(client=client, seed=self.seed, num_clients=self.num_clients, settings=dict(self.settings))


def workload_from_env(env: Mapping[str, str]) -> Workload:
    """FEDAT_APP, FEDAT_NUM_CLIENTS and FEDAT_SEED, and every FEDAT_* variable for the app."""
    d = Workload()
    return Workload(
        app=config.get_str(env, "FEDAT_APP", d.app),
        num_clients=config.get_int(env, "FEDAT_NUM_CLIENTS", d.num_clients),
        seed=config.get_int(env, "FEDAT_SEED", d.seed),
        settings=tuple(sorted((k, v) for k, v in env.items() if k.startswith("FEDAT_"))),
    )


def load_clients(w: Workload, app: App | None = None) -> list[ClientData]:
    """Every logical client's data, from the app (checked)."""
    app = app or load_app(w.app)
    return [client_data(app, w.context(k)) for k in range(w.num_clients)]


def build(w: Workload, threads: int, stopping: Callable[[], bool] = lambda: False):
    """Clients, model and trainer for this process (imports TensorFlow); AppError if the app's parts do not fit."""
    from fedat_worker.models import configure_threads

    configure_threads(threads)
    app = load_app(w.app)
    clients = load_clients(w, app)
    model, trainer = model_and_trainer(app, w.context(-1), clients[0], f"app {w.app}", stopping)
    return clients, model, trainer


def model_and_trainer(app: App, ctx: Context, data: ClientData, who: str, stopping: Callable[[], bool]):
    """The app's model, checked against a client's data, and the trainer around it, with the app's own settings
    winning over a task's (imports TensorFlow)."""
    from fedat_worker.trainer import LocalTrainer

    model = app.model(ctx)
    check_model(model, data, who)
    overrides = Overrides(app.learning_rate, app.batch_size, app.epochs)
    return model, tuned(LocalTrainer(model, stopping=stopping), overrides)

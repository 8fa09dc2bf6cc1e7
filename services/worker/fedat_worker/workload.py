"""What a worker or evaluator process holds: the federated data set and the model, built once from settings."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from fedat import config
from fedat_worker.data import LOADERS, ClientData, federate


@dataclass(frozen=True)
class Workload:
    """Data set, partition and model; identical in every process of one experiment (deterministic by seed)."""

    dataset: str = "fashion-mnist"
    data_root: str = ""
    model: str = "cnn"
    scheme: str = "shards"
    num_clients: int = 100
    classes_per_client: int = 2
    alpha: float = 0.5
    samples_per_client: int = 0  # 0 = all; a cap keeps tests small
    seed: int = 0


def workload_from_env(env: Mapping[str, str]) -> Workload:
    """Read FEDAT_DATASET, FEDAT_DATA_ROOT, FEDAT_MODEL, FEDAT_PARTITION, FEDAT_NUM_CLIENTS, ... ."""
    d = Workload()
    return Workload(
        dataset=config.get_str(env, "FEDAT_DATASET", d.dataset),
        data_root=config.get_str(env, "FEDAT_DATA_ROOT", d.data_root),
        model=config.get_str(env, "FEDAT_MODEL", d.model),
        scheme=config.get_str(env, "FEDAT_PARTITION", d.scheme),
        num_clients=config.get_int(env, "FEDAT_NUM_CLIENTS", d.num_clients),
        classes_per_client=config.get_int(env, "FEDAT_CLASSES_PER_CLIENT", d.classes_per_client),
        alpha=config.get_float(env, "FEDAT_DIRICHLET_ALPHA", d.alpha),
        samples_per_client=config.get_int(env, "FEDAT_SAMPLES_PER_CLIENT", d.samples_per_client),
        seed=config.get_int(env, "FEDAT_SEED", d.seed),
    )


def _cap(c: ClientData, n: int) -> ClientData:
    test = max(1, n // 4)
    return replace(c, x_train=c.x_train[:n], y_train=c.y_train[:n], x_test=c.x_test[:test], y_test=c.y_test[:test])


def load_clients(w: Workload) -> tuple[list[ClientData], int]:
    """The federated clients and the number of classes."""
    if w.dataset not in LOADERS:
        raise config.ConfigError(f"FEDAT_DATASET={w.dataset!r} is not one of {sorted(LOADERS)}")
    ds = LOADERS[w.dataset](w.data_root) if w.data_root else LOADERS[w.dataset]()
    clients = federate(
        ds,
        scheme=w.scheme,
        num_clients=w.num_clients,
        seed=w.seed,
        classes_per_client=w.classes_per_client,
        alpha=w.alpha,
    )
    if w.samples_per_client:
        clients = [_cap(c, w.samples_per_client) for c in clients]
    return clients, ds.num_classes


def build(w: Workload, threads: int, stopping: Callable[[], bool] = lambda: False):
    """Clients, model and trainer for this process (imports TensorFlow)."""
    from fedat_worker.models import build_model, configure_threads
    from fedat_worker.trainer import LocalTrainer

    configure_threads(threads)
    clients, num_classes = load_clients(w)
    model = build_model(w.model, tuple(clients[0].x_train.shape[1:]), num_classes, seed=w.seed)
    return clients, model, LocalTrainer(model, stopping=stopping)

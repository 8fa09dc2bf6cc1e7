"""`fedat-worker`: one worker process serving train tasks, configured by FEDAT_* variables."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass

from fedat.fl.latency import StragglerProfile, client_profiles
from fedat.protocol.system import BY_NAME
from fedat.runtime import config
from fedat.runtime.bus import BrokerConfig
from fedat.runtime.serving import serve_forever, setup_logging, stop_on_signals
from fedat_worker.metrics import worker_metrics
from fedat_worker.workload import Workload, build, workload_from_env

ME = BY_NAME["worker"]  # this service's row of the system table


@dataclass(frozen=True)
class Settings:
    """Everything a worker process needs."""

    broker: BrokerConfig
    workload: Workload
    straggler: StragglerProfile
    tiers: tuple[int, ...]
    profile_queue: bool
    threads: int
    metrics_port: int


def settings(env: Mapping[str, str]) -> Settings:
    """Build the settings from the environment."""
    num_tiers = config.get_int(env, "FEDAT_NUM_TIERS", 5)
    workload, straggler = workload_from_env(env), config.latency(env)
    sizes = straggler.group_sizes
    if sizes and (len(sizes) != len(straggler.delays) or sum(sizes) != workload.num_clients):
        raise config.ConfigError(
            f"FEDAT_GROUP_SIZES={','.join(map(str, sizes))} must give each of the {len(straggler.delays)} delay "
            f"groups a size, summing to FEDAT_NUM_CLIENTS={workload.num_clients}"
        )
    return Settings(
        broker=config.broker(env, ME.prefetch),
        workload=workload,
        straggler=straggler,
        tiers=config.get_ints(env, "FEDAT_TIERS", tuple(range(1, num_tiers + 1))),
        profile_queue=config.get_int(env, "FEDAT_PROFILE_QUEUE", 1) == 1,
        threads=config.get_int(env, "FEDAT_TF_THREADS", 1),
        metrics_port=config.get_int(env, "FEDAT_METRICS_PORT", ME.metrics_port),
    )


def main() -> None:
    """Run one worker until SIGTERM; a task in training is given back to its queue within one epoch."""
    setup_logging("worker")
    s = settings(os.environ)
    stop = stop_on_signals()
    from fedat_worker.models import weight_names
    from fedat_worker.worker import Worker, WorkerConfig

    clients, model, trainer = build(s.workload, s.threads, stop.is_set)
    metrics = worker_metrics()
    worker = Worker(
        WorkerConfig(s.tiers, s.profile_queue, s.straggler, s.workload.seed),
        clients,
        trainer,
        weight_names(model),
        [w.copy() for w in model.get_weights()],
        client_profiles(s.workload.num_clients, s.straggler, s.workload.seed),
        time.time,
        metrics,
    )
    serve_forever(worker, s.broker, metrics.transport.registry, metrics.transport, s.metrics_port, stop=stop)


if __name__ == "__main__":
    main()

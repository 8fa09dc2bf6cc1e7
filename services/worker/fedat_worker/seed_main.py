"""`fedat-seed`: publishes the initial global model w0 (version 0), which starts every tier's first round."""

from __future__ import annotations

import logging
import os
import time

from fedat import config, topology
from fedat.bus import publish_once
from fedat.runtime import setup_logging
from fedat.service import Outgoing
from fedat.wire import seed_model
from fedat_worker.workload import workload_from_env

log = logging.getLogger(__name__)


def main() -> None:
    """Build the model from the experiment seed and publish it once."""
    setup_logging("seed")
    env = os.environ
    workload = workload_from_env(env)
    broker = config.broker(env, 1)
    from fedat_worker.models import build_model, weight_names
    from fedat_worker.workload import load_clients

    clients, num_classes = load_clients(workload)
    model = build_model(workload.model, tuple(clients[0].x_train.shape[1:]), num_classes, seed=workload.seed)
    msg = seed_model(
        model.get_weights(),
        weight_names(model),
        broker.num_tiers,
        config.get_str(env, "FEDAT_CODEC", "polyline"),
        config.get_int(env, "FEDAT_PRECISION", 4),
        time.time(),
    )
    publish_once(broker, [Outgoing(topology.GLOBAL, "", msg)])
    log.info("published the seed model (%d layers)", len(msg.layers))


if __name__ == "__main__":
    main()

"""`fedat-seed`: publishes the initial global model w0 (version 0), which starts every tier's first round."""

from __future__ import annotations

import logging
import os
import time

from fedat.protocol import topology
from fedat.protocol.service import Outgoing
from fedat.protocol.system import BY_NAME
from fedat.protocol.wire import seed_model
from fedat.runtime import config
from fedat.runtime.bus import publish_once
from fedat.runtime.serving import setup_logging
from fedat_worker.workload import workload_from_env

ME = BY_NAME["seed"]  # this service's row of the system table

log = logging.getLogger(__name__)


def main() -> None:
    """Build the model from the experiment seed and publish it once."""
    setup_logging("seed")
    env = os.environ
    workload = workload_from_env(env)
    broker = config.broker(env, ME.prefetch)
    from fedat_worker.app import load_app
    from fedat_worker.models import weight_names

    model = load_app(workload.app).model(workload.context(-1))  # w0: the app's model built with the experiment's seed
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

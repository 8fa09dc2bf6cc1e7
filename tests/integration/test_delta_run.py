"""A run with the delta codec on the real broker: worker, barrier and aggregator make global models from deltas."""

from __future__ import annotations

import time

import numpy as np
import pytest

from fedat.fl.latency import ClientProfile, StragglerProfile
from fedat.fl.strategies import build_strategy
from fedat.protocol import topology
from fedat.protocol.codec import CODECS
from fedat.protocol.signing import Keyring
from fedat.protocol.wire import TierAssignment, decode_model, seed_model
from fedat_aggregator.aggregator import Aggregator, AggregatorConfig
from fedat_aggregator.barrier import Barrier, BarrierConfig
from fedat_sim.fakes import fake_parts
from fedat_worker.worker import Worker, WorkerConfig

from .broker import publish, running, tap

pytestmark = pytest.mark.broker

KEYRING = Keyring.from_secret(bytes(range(64, 96)))
CLIENTS = (0, 1, 2, 3)


def test_a_run_with_the_delta_codec_makes_global_models(vhost_url):
    parts = fake_parts(len(CLIENTS))
    rng = np.random.default_rng(0)
    w0 = [rng.normal(0, 0.05, w.shape).astype(np.float32) for w in parts.initial]
    profiles = tuple(ClientProfile(c, 0, (0.0, 0.0), 1.0, None) for c in CLIENTS)
    worker = Worker(
        WorkerConfig(tiers=(1,), profile_queue=False, straggler=StragglerProfile(time_scale=0.0)),
        parts.clients,
        parts.trainer,
        list(parts.names),
        w0,
        profiles,
        time.time,
    )
    barrier = Barrier(
        BarrierConfig(tiers=(1,), clients_per_round=2, min_clients=2, codec="delta", precision=4, min_deadline=30),
        build_strategy("fedat"),
    )
    aggregator = Aggregator(AggregatorConfig(num_tiers=1, codec="delta", precision=4), build_strategy("fedat"))
    with (
        running(barrier, vhost_url, 1, keyring=KEYRING),
        running(aggregator, vhost_url, 1, keyring=KEYRING),
        running(worker, vhost_url, 1, keyring=KEYRING),
        tap(vhost_url, topology.GLOBAL) as next_global,  # every version: services may outpace the bounded observers
    ):
        assignment = TierAssignment("a1", 1, (CLIENTS,), {c: 0.1 for c in CLIENTS}, time.time())
        publish(vhost_url, topology.CONTROL, "", assignment, num_tiers=1, keyring=KEYRING)
        g0 = seed_model(w0, list(parts.names), 1, "delta", 4, time.time())
        publish(vhost_url, topology.GLOBAL, "", g0, num_tiers=1, keyring=KEYRING)
        by_version = {}
        while len(by_version) < 4:
            g = next_global(timeout=60)
            assert g is not None, f"only versions {sorted(by_version)} came"
            by_version.setdefault(g.version, g)  # a copy re-sent after a reconnect has the same content
    models = [by_version[v] for v in sorted(by_version)]
    assert [m.version for m in models] == [0, 1, 2, 3]
    assert all(layer.codec == "delta" and CODECS[layer.codec].relative for m in models for layer in m.layers)
    # Each version merged one round of two clients, whose deltas the barrier decoded against the round's model.
    assert [m.updates for m in models] == [0, 2, 4, 6]
    weights = [decode_model(m.layers) for m in models]
    assert all(np.isfinite(w).all() for ws in weights for w in ws)
    pairs = zip(weights, weights[1:], strict=False)
    moved = [max(float(np.abs(a - b).max()) for a, b in zip(x, y, strict=True)) for x, y in pairs]
    assert all(m > 1e-3 for m in moved), moved  # the models really trained
    assert models[-1].bytes_up > 0 and models[-1].bytes_down > 0

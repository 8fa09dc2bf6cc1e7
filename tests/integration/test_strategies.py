"""Every registered strategy runs two global versions through the real broker, the test playing the clients."""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np
import pytest

from fedat.fl.strategies import STRATEGIES, build_strategy
from fedat.protocol import topology
from fedat.protocol.wire import GlobalModel, decode_model
from fedat_aggregator.aggregator import Aggregator, AggregatorConfig
from fedat_aggregator.aggregator_main import settings as aggregator_settings
from fedat_aggregator.barrier import Barrier, BarrierConfig

from ..factories import answer
from .broker import fetch, publish, running
from .test_pipeline import start_tier

pytestmark = pytest.mark.broker


def small(strategy):
    """The registered strategy, with concurrency and buffer cut to fit four clients and two versions."""
    fields = strategy.__dataclass_fields__
    cuts = {k: v for k, v in {"concurrency": 2, "buffer_size": 2}.items() if k in fields}
    return replace(strategy, **cuts)


def two_versions(url: str, barrier: Barrier, aggregator: Aggregator, value) -> tuple[list[GlobalModel], int]:
    """Run one tier of four clients until version 2, the test answering each task with `value(task)` everywhere:
    the published versions after w0, and the number of answers sent."""
    versions: list[GlobalModel] = []
    answered = 0
    with running(barrier, url, 1), running(aggregator, url, 1):
        start_tier(url, (0, 1, 2, 3))
        deadline = time.time() + 60
        while (not versions or versions[-1].version < 2) and time.time() < deadline:
            task = fetch(url, topology.train_queue(1), timeout=1.0)
            if task is not None:
                publish(url, topology.RESULTS, topology.tier_key(1), answer(task, value(task)), 1)
                answered += 1
            g = fetch(url, topology.RECORDER_GLOBAL, timeout=0.2)
            while g is not None:
                versions += [g] if g.version > 0 else []
                g = fetch(url, topology.RECORDER_GLOBAL, timeout=0.2)
    return versions, answered


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_every_strategy_publishes_two_versions_from_real_rounds(vhost_url, name):
    strategy = small(build_strategy(name))
    per_round = 1 if "concurrency" in strategy.__dataclass_fields__ else 2
    cfg = BarrierConfig(tiers=(1,), clients_per_round=per_round, min_clients=1, codec="raw", min_deadline=30.0)
    barrier = Barrier(cfg, strategy)
    aggregator = Aggregator(AggregatorConfig(num_tiers=1, codec="raw"), strategy)
    versions, answered = two_versions(vhost_url, barrier, aggregator, lambda task: 1.0 + task.client)
    assert [g.version for g in versions][:2] == [1, 2], f"{name}: versions {[g.version for g in versions]}"
    merged = [pair for g in versions for pair in g.merged]
    assert merged and len(merged) == len(set(merged)), f"{name}: a round merged twice: {merged}"
    assert versions[-1].updates <= answered and versions[-1].tier_counts[0] == len(merged)


def test_a_decayed_server_step_set_by_the_environment_reaches_the_published_globals(vhost_url):
    # The aggregator built as its main() builds it: FEDAT_SERVER_LR_DECAY=1 gives η_T = 1/sqrt(1 + T) after T rounds.
    env = {"FEDAT_STRATEGY": "fedat-delta", "FEDAT_SERVER_LR_DECAY": "1", "FEDAT_NUM_TIERS": "1", "FEDAT_CODEC": "raw"}
    env["FEDAT_SIGNING"] = "off"  # as the other strategy tests, an unsigned development vhost
    s = aggregator_settings(env)
    assert s.strategy.server_lr_decay == 1.0
    cfg = BarrierConfig(tiers=(1,), clients_per_round=2, min_clients=1, codec="raw", min_deadline=30.0)
    # every client returns 2.0, so every tier model is exactly 2.0
    versions, _ = two_versions(vhost_url, Barrier(cfg, s.strategy), Aggregator(s.aggregator, s.strategy), lambda _: 2.0)
    assert [g.version for g in versions][:2] == [1, 2]
    # version 1: one round merged, η = 1/sqrt(2), from w0 = 0 toward 2.0 (a constant step would land on 2.0)
    np.testing.assert_allclose(versions[0].tier_weights, [2**-0.5], rtol=1e-6)
    for layer in decode_model(versions[0].layers):
        np.testing.assert_allclose(layer, 2.0 * 2**-0.5, rtol=1e-5)
    # version 2: two rounds merged, η = 1/sqrt(3), times the staleness factor (1 if based on version 1)
    assert 0.0 < versions[1].tier_weights[0] <= 3**-0.5 + 1e-9

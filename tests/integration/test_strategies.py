"""Every registered strategy runs two global versions through the real broker, the test playing the clients."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from fedat import topology
from fedat.wire import GlobalModel
from fedat_aggregator.aggregator import Aggregator, AggregatorConfig
from fedat_aggregator.barrier import Barrier, BarrierConfig
from fedat_aggregator.strategy import STRATEGIES, build_strategy

from ..factories import answer
from .broker import fetch, publish, running
from .test_pipeline import start_tier

pytestmark = pytest.mark.broker


def small(strategy):
    """The registered strategy, with concurrency and buffer cut to fit four clients and two versions."""
    fields = strategy.__dataclass_fields__
    cuts = {k: v for k, v in {"concurrency": 2, "buffer_size": 2}.items() if k in fields}
    return replace(strategy, **cuts)


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_every_strategy_publishes_two_versions_from_real_rounds(vhost_url, name):
    strategy = small(build_strategy(name))
    per_round = 1 if "concurrency" in strategy.__dataclass_fields__ else 2
    cfg = BarrierConfig(tiers=(1,), clients_per_round=per_round, min_clients=1, codec="raw", min_deadline=30.0)
    barrier = Barrier(cfg, strategy)
    aggregator = Aggregator(AggregatorConfig(num_tiers=1, codec="raw"), strategy)
    with running(barrier, vhost_url, 1), running(aggregator, vhost_url, 1):
        start_tier(vhost_url, (0, 1, 2, 3))
        versions: list[GlobalModel] = []
        answered = 0
        deadline = time.time() + 60
        while (not versions or versions[-1].version < 2) and time.time() < deadline:
            task = fetch(vhost_url, topology.train_queue(1), timeout=1.0)
            if task is not None:
                publish(vhost_url, topology.RESULTS, topology.tier_key(1), answer(task, 1.0 + task.client), 1)
                answered += 1
            g = fetch(vhost_url, topology.RECORDER_GLOBAL, timeout=0.2)
            while g is not None:
                if g.version > 0:
                    versions.append(g)
                g = fetch(vhost_url, topology.RECORDER_GLOBAL, timeout=0.2)
    assert [g.version for g in versions][:2] == [1, 2], f"{name}: versions {[g.version for g in versions]}"
    merged = [pair for g in versions for pair in g.merged]
    assert merged and len(merged) == len(set(merged)), f"{name}: a round merged twice: {merged}"
    assert versions[-1].updates <= answered and versions[-1].tier_counts[0] == len(merged)

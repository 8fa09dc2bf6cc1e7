"""Durability benchmark, side by side in one run: barrier + aggregator merge rate with checkpoints on vs off
(target: on >= 80 % of off), the size of each checkpoint, and how long a restarted service takes to restore."""

from __future__ import annotations

import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.bench_pipeline import aggregator_side  # noqa: E402
from fedat.fl.strategies import build_strategy  # noqa: E402
from fedat.ops import broker_admin  # noqa: E402
from fedat.runtime.brokerstore import BrokerStore  # noqa: E402
from fedat_aggregator.aggregator import Aggregator, AggregatorConfig  # noqa: E402
from fedat_aggregator.barrier import Barrier, BarrierConfig  # noqa: E402
from tests.integration.broker import channel, running  # noqa: E402

TIERS = 5
REPEATS = 2


def held(ch, store: BrokerStore) -> int:
    """Bytes of the service's checkpoints on the broker (its snapshot and the journal entries since), left there."""
    total, tags = 0, []
    for queue in (store.queue, *store.journals):
        while True:
            method, _, body = ch.basic_get(queue, auto_ack=False)
            if method is None:
                break
            total += len(body)
            tags.append(method.delivery_tag)
    for tag in tags:
        ch.basic_nack(delivery_tag=tag, requeue=True)
    return total


def restores(url: str) -> dict[str, tuple[float, float, int]]:
    """Per service: (seconds from start to consuming again, seconds spent restoring, checkpoint bytes it reads)."""
    services = {
        "barrier": Barrier(BarrierConfig(tiers=tuple(range(1, TIERS + 1)), min_deadline=60), build_strategy("fedat")),
        "aggregator": Aggregator(AggregatorConfig(num_tiers=TIERS), build_strategy("fedat")),
    }
    out = {}
    for name, service in services.items():
        with channel(url, TIERS) as ch:
            size = held(ch, BrokerStore(name))
        started = time.perf_counter()
        with running(service, url, TIERS, prefetch=400) as m:
            out[name] = (time.perf_counter() - started, m.restore_seconds._sum.get(), size)
    return out


def main() -> None:
    """Print the persistence table."""
    rates: dict[bool, list[float]] = {False: [], True: []}
    restored = {}
    for _ in range(REPEATS):
        for persist in (False, True):  # interleaved, so that drift of the machine hits both alike
            name = f"fedat-bench-{uuid.uuid4().hex[:8]}"
            url = broker_admin.create_vhost(name)
            try:
                rates[persist].append(aggregator_side(url, persist=persist))
                if persist:
                    restored = restores(url)
            finally:
                broker_admin.delete_vhost(name)
    off, on = statistics.median(rates[False]), statistics.median(rates[True])
    print("\n## Durability: barrier + aggregator, 5 tiers x 10 clients, CNN updates (polyline p=4)\n")
    print(f"| checkpoints | updates merged/s (median of {REPEATS}) |\n|---|---:|")
    print(f"| off (memory only) | {off:.0f} |\n| on (saved before every output) | {on:.0f} |")
    print(f"| **ratio on / off** | **{on / off:.0%}** (target >= 80 %) |")
    print("\n| service | checkpoint bytes read | restart to consuming (s) | of which restoring (s) |")
    print("|---|---:|---:|---:|")
    for name, (total, restoring, size) in restored.items():
        print(f"| {name} | {size:,} | {total:.2f} | {restoring:.3f} |")


if __name__ == "__main__":
    main()

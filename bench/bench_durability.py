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
from fedat import broker_admin  # noqa: E402
from fedat.bus import BrokerStore  # noqa: E402
from fedat_aggregator.aggregator import Aggregator, AggregatorConfig  # noqa: E402
from fedat_aggregator.barrier import Barrier, BarrierConfig  # noqa: E402
from fedat_aggregator.strategy import STRATEGIES  # noqa: E402
from tests.integration.broker import channel, running  # noqa: E402

TIERS = 5
REPEATS = 2


def restores(url: str) -> dict[str, tuple[float, float, int]]:
    """Per service: (seconds from start to consuming again, seconds spent restoring, checkpoint bytes)."""
    services = {
        "barrier": Barrier(BarrierConfig(tiers=tuple(range(1, TIERS + 1)), min_deadline=60), STRATEGIES["fedat"]),
        "aggregator": Aggregator(AggregatorConfig(num_tiers=TIERS), STRATEGIES["fedat"]),
    }
    out = {}
    for name, service in services.items():
        with channel(url, TIERS) as ch:
            size = len(ch.basic_get(BrokerStore(name).queue, auto_ack=False)[2] or b"")
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
    print("\n| service | checkpoint bytes | restart to consuming (s) | of which restoring (s) |\n|---|---:|---:|---:|")
    for name, (total, restoring, size) in restored.items():
        print(f"| {name} | {size:,} | {total:.2f} | {restoring:.3f} |")


if __name__ == "__main__":
    main()

"""A broker outage restarts nothing: liveness means "this process is stuck", readiness "connected to the broker".

The barrier, the aggregator and the profiler run as real processes (`python -m ...`, as in a pod) against a
private RabbitMQ node, with a liveness window of a few seconds (FEDAT_LIVENESS_SECONDS). The node is stopped for
several windows while every service's /healthz and /readyz are polled: /healthz must never fail (Kubernetes
would restart the pod), /readyz must fail while the broker is away and pass again once it is back, and the same
processes must then carry on (they adopt a seed model published after the outage and checkpoint it).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pika
import pytest

from fedat.deploy.ports import free_ports
from fedat.ops.devbroker import PrivateBroker
from fedat.protocol import topology, wire

from ..factories import seed
from .broker import http_status, wait_for

pytestmark = [pytest.mark.broker, pytest.mark.alone]

LIVENESS = 3.0  # seconds; the chart's default is 60 (probes.liveness x failureThreshold on top)
OUTAGE = 4 * LIVENESS
SERVICES = {
    "barrier": "fedat_aggregator.barrier_main",
    "aggregator": "fedat_aggregator.aggregator_main",
    "profiler": "fedat_profiler.main",
}


def metric(port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    m = re.search(rf"^{name} (\S+)$", text, re.M)
    return float(m[1]) if m else 0.0


class Poller(threading.Thread):
    """Polls every service's /healthz and /readyz every 0.2 s, as a kubelet would, and keeps what it saw."""

    def __init__(self, ports: dict[str, int]):
        super().__init__(daemon=True)
        self.ports = ports
        self.stop = threading.Event()
        self.health_failures: list[tuple[str, float, int]] = []
        self.not_ready: dict[str, int] = dict.fromkeys(ports, 0)

    def run(self) -> None:
        while not self.stop.is_set():
            for name, port in self.ports.items():
                code = http_status(port, "/healthz")
                if code != 200:
                    self.health_failures.append((name, time.time(), code))
                if http_status(port, "/readyz") == 503:
                    self.not_ready[name] += 1
            self.stop.wait(0.2)


def test_a_broker_outage_longer_than_the_liveness_window_fails_readiness_only(tmp_path):
    with PrivateBroker() as broker:
        url = broker.add_vhost("fedat")
        ports = dict(zip(SERVICES, free_ports(len(SERVICES)), strict=True))
        env = {
            **os.environ,
            "FEDAT_AMQP_URL": url,
            "FEDAT_SIGNING": "off",
            "FEDAT_NUM_TIERS": "1",
            "FEDAT_NUM_CLIENTS": "4",
            "FEDAT_LIVENESS_SECONDS": str(LIVENESS),
        }
        procs: dict[str, subprocess.Popen] = {}
        holder = None
        try:
            for name, module in SERVICES.items():
                log = open(tmp_path / f"{name}.log", "wb")
                procs[name] = subprocess.Popen(
                    [sys.executable, "-m", module],
                    env={**env, "FEDAT_METRICS_PORT": str(ports[name])},
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
                log.close()

            def logs() -> str:
                return "\n".join(f"--- {n}\n{(tmp_path / f'{n}.log').read_text()[-3000:]}" for n in SERVICES)

            # The profiler starts once a worker consumes the profiling queue: one stands in (it only holds tasks).
            wait_for(lambda: http_status(ports["barrier"], "/readyz") == 200, 60, "the barrier connected (topology up)")
            holder = pika.BlockingConnection(pika.URLParameters(url))
            holder.channel().basic_consume(topology.PROFILE_QUEUE, lambda *a: None)
            for name, port in ports.items():
                wait_for(lambda port=port: http_status(port, "/readyz") == 200, 60, f"{name} connected\n{logs()}")
            poller = Poller(ports)
            poller.start()

            broker.stop()
            stopped = time.monotonic()
            # Every service notices (readiness fails) while the broker stays away for several liveness windows.
            wait_for(lambda: all(n >= 3 for n in poller.not_ready.values()), OUTAGE, "every /readyz failing")
            time.sleep(max(0.0, OUTAGE - (time.monotonic() - stopped)))
            broker.start()
            for name, port in ports.items():
                wait_for(lambda port=port: http_status(port, "/readyz") == 200, 60, f"{name} reconnected\n{logs()}")
            poller.stop.set()
            poller.join(timeout=10)

            assert poller.health_failures == [], f"liveness failed during the outage\n{logs()}"
            assert all(p.poll() is None for p in procs.values()), logs()  # the same processes, none restarted
            for name, port in ports.items():
                assert metric(port, "fedat_broker_reconnects_total") >= 1, name

            # They carry on: a seed model published after the outage is adopted and checkpointed by both.
            saves = {n: metric(ports[n], "fedat_state_saves_total") for n in ("barrier", "aggregator")}
            conn = pika.BlockingConnection(pika.URLParameters(url))
            ch = conn.channel()
            ch.confirm_delivery()
            ch.basic_publish(topology.GLOBAL, "", wire.encode(seed(1)), pika.BasicProperties(delivery_mode=2))
            conn.close()
            for name, before in saves.items():
                wait_for(
                    lambda name=name, before=before: metric(ports[name], "fedat_state_saves_total") > before,
                    30,
                    f"{name} checkpointing the seed after the outage\n{logs()}",
                )
        finally:
            if holder is not None:
                try:
                    holder.close()
                except pika.exceptions.AMQPError:
                    pass  # the outage already closed it
            for p in procs.values():
                p.terminate()
            for p in procs.values():
                try:
                    p.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    p.kill()

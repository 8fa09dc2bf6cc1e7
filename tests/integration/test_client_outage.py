"""A real client rides out a broker outage: the same process reconnects, joins again and answers its tasks.

One `fedat-client` process against a private RabbitMQ node (never the shared one) whose topology and client queues
were made by the administrator, as enrollment does. The node is stopped and started again; the client must stay up
(/healthz), say it is back with a second join of a new id, and answer a profiling task sent after the outage.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pika
import pytest

from fedat.deploy.ports import free_port
from fedat.protocol import topology, wire
from fedat.protocol.wire import Join, TrainTask, Update

from .broker import http_status, wait_for
from .real_client_app import write_shard

pytestmark = [pytest.mark.broker, pytest.mark.tf, pytest.mark.alone]

K = 2  # the client's id


def drain(url: str, queue: str) -> list:
    """Every message now in `queue`, decoded (acked)."""
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        ch, out = conn.channel(), []
        while True:
            method, _, body = ch.basic_get(queue, auto_ack=True)
            if method is None:
                return out
            out.append(wire.decode(body))
    finally:
        conn.close()


def test_a_client_reconnects_after_a_broker_outage_joins_again_and_answers(tmp_path):
    from fedat.ops.devbroker import PrivateBroker

    with PrivateBroker() as broker:
        url = broker.add_vhost("fedat")
        conn = pika.BlockingConnection(pika.URLParameters(url))
        ch = conn.channel()
        topology.declare(ch, 1)
        for q in topology.client_queues(K):  # what enrollment does as the administrator
            ch.queue_declare(q.name, durable=True, arguments=q.arguments)
            for exchange, key in q.bindings:
                ch.queue_bind(q.name, exchange, key)
        conn.close()
        write_shard(K, tmp_path)
        port = free_port()
        env = {
            **os.environ,
            "FEDAT_CLIENT_ID": str(K),
            "FEDAT_AMQP_URL": url,
            "FEDAT_SIGNING": "off",
            "FEDAT_NUM_TIERS": "1",
            "FEDAT_DATA_ROOT": str(tmp_path),
            "FEDAT_METRICS_PORT": str(port),
            "FEDAT_LIVENESS_SECONDS": "3",
        }
        log = open(tmp_path / "client.log", "wb")  # noqa: SIM115 — the process keeps it
        app = "tests.integration.real_client_app:app"
        proc = subprocess.Popen(
            [sys.executable, "-m", "fedat_worker.client_main", "--app", app], env=env, stdout=log, stderr=log
        )
        try:
            wait_for(lambda: http_status(port, "/readyz") == 200, 120, "the client connected")
            (first,) = wait_for(lambda: drain(url, topology.PROFILER_MEMBERS), 30, "its first join")
            assert isinstance(first, Join) and first.client == K

            broker.stop()
            wait_for(lambda: http_status(port, "/readyz") == 503, 30, "the client to notice the outage")
            time.sleep(4)  # longer than its liveness window: a stuck loop would fail /healthz now
            assert http_status(port, "/healthz") == 200
            broker.start()

            wait_for(lambda: http_status(port, "/readyz") == 200, 60, "the client reconnected")
            (again,) = wait_for(lambda: drain(url, topology.PROFILER_MEMBERS), 30, "a join after the outage")
            assert isinstance(again, Join) and again.client == K and again.id != first.id
            assert proc.poll() is None  # the same process

            task = TrainTask(f"p-c{K}", K, 0, 0, 0, 1, 16, 0.01, 0.0, "polyline", 4, time.time(), (), 0.0)
            conn = pika.BlockingConnection(pika.URLParameters(url))
            conn.channel().basic_publish(topology.TRAIN, topology.client_key(K), wire.encode(task))
            conn.close()
            (answer,) = wait_for(lambda: drain(url, topology.PROFILER_RESULTS), 30, "its answer to a profiling task")
            assert isinstance(answer, Update) and answer.task_id == f"p-c{K}" and answer.layers == ()
        finally:
            proc.terminate()
            assert proc.wait(30) == 0
            log.close()

"""The metrics port answers Kubernetes' probes: /healthz (the process is not stuck), /readyz (connected to the broker),
and a durable service's /fingerprint; the run loop keeps the liveness stamp turning while it reconnects."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request

import pytest
from prometheus_client import CollectorRegistry

from fedat.errors import ConfigError
from fedat.runtime import bus
from fedat.runtime.config import amqp_url
from fedat.runtime.metrics import LIVENESS_SECONDS, alive, serve, transport_metrics


def _get(port: int, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_probes_follow_the_connection_and_the_event_loop():
    port = _port()
    m = transport_metrics(CollectorRegistry(), "barrier")
    serve(m.registry, port, m)
    assert _get(port, "/readyz")[0] == 503  # not connected yet
    assert _get(port, "/healthz")[0] == 200  # the loop has not started: alive
    m.connected.set(1)
    m.loop.set(time.time())
    assert _get(port, "/readyz") == (200, b"ok\n") and _get(port, "/healthz")[0] == 200
    m.loop.set(time.time() - LIVENESS_SECONDS - 1)
    assert _get(port, "/healthz") == (503, b"event loop stalled\n")
    status, body = _get(port, "/metrics")
    assert status == 200 and b"fedat_broker_connected 1.0" in body
    assert _get(port, "/nope")[0] == 404
    assert _get(port, "/fingerprint")[0] == 404  # not a durable service


def test_the_liveness_window_is_configurable_and_a_durable_service_serves_its_fingerprint():
    port = _port()
    m = transport_metrics(CollectorRegistry(), "aggregator")
    serve(m.registry, port, m, liveness_seconds=2.0, fingerprint={"state_version": "1", "num_tiers": "5"})
    m.loop.set(time.time() - 3)
    assert _get(port, "/healthz")[0] == 503
    m.loop.set(time.time() - 1)
    assert _get(port, "/healthz")[0] == 200
    status, body = _get(port, "/fingerprint")
    assert status == 200 and json.loads(body) == {"num_tiers": "5", "state_version": "1"}
    assert alive(0.0, 1e9, 1.0) and alive(99.5, 100.0, 1.0) and not alive(98.0, 100.0, 1.0)


def test_waiting_to_reconnect_keeps_the_liveness_stamp_turning():
    m = transport_metrics(CollectorRegistry(), "worker")
    stop = threading.Event()
    stamps = []
    t = threading.Thread(target=bus.pause, args=(stop, 1.2, m, 0.1))
    t.start()
    while t.is_alive():
        stamps.append(m.loop._value.get())
        time.sleep(0.05)
    assert len(set(stamps)) >= 5  # stamped all along the wait, not once before it
    stop.set()
    started = time.monotonic()
    bus.pause(stop, 30.0, m)  # a stop ends the wait at once
    assert time.monotonic() - started < 5


def test_the_amqp_url_can_come_from_a_mounted_file(tmp_path):
    assert amqp_url({"FEDAT_AMQP_URL": "amqp://from-env"}) == "amqp://from-env"
    (tmp_path / "url").write_text("amqps://u:p%40ss@mq:5671/fedat\n")
    given = {"FEDAT_AMQP_URL": "amqp://from-env", "FEDAT_AMQP_URL_FILE": str(tmp_path / "url")}
    assert amqp_url(given) == "amqps://u:p%40ss@mq:5671/fedat"  # the file wins
    with pytest.raises(ConfigError, match="cannot read it"):
        amqp_url({"FEDAT_AMQP_URL_FILE": str(tmp_path / "missing")})
    (tmp_path / "bad").write_text("p@ssword-only")
    with pytest.raises(ConfigError, match="does not hold an amqp"):
        amqp_url({"FEDAT_AMQP_URL_FILE": str(tmp_path / "bad")})

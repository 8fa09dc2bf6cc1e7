"""The metrics port answers Kubernetes' probes: /healthz (the event loop turns), /readyz (connected to the broker)."""

from __future__ import annotations

import socket
import time
import urllib.error
import urllib.request

from prometheus_client import CollectorRegistry

from fedat.metrics import LIVENESS_SECONDS, serve, transport_metrics


def _get(port: int, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_probes_follow_the_connection_and_the_event_loop():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
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

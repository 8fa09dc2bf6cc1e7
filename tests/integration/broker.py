"""Test-side helpers for talking to the real broker: publish, fetch, inspect queues, run a service in a thread."""

from __future__ import annotations

import subprocess
import threading
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from urllib.parse import unquote, urlparse

import pika
import pika.exceptions as pe
from prometheus_client import CollectorRegistry

from fedat.protocol import topology, wire
from fedat.runtime.bus import BrokerConfig, run_service
from fedat.runtime.metrics import transport_metrics
from fedat.runtime.tls import TlsConfig, ssl_options


def vhost_of(url: str) -> str:
    """The vhost name in an AMQP URL."""
    return unquote(urlparse(url).path[1:])


def parameters(url: str, tls: TlsConfig | None = None) -> pika.URLParameters:
    """Connection parameters for `url`, over verified (mutual) TLS when `tls` is given."""
    params = pika.URLParameters(url)
    if tls is not None:
        params.ssl_options = ssl_options(tls)
    return params


@contextmanager
def channel(url: str, num_tiers: int = 5, tls: TlsConfig | None = None):
    """A confirm channel on the test vhost with the topology declared."""
    conn = pika.BlockingConnection(parameters(url, tls))
    ch = conn.channel()
    ch.confirm_delivery()
    topology.declare(ch, num_tiers)
    try:
        yield ch
    finally:
        conn.close()


def publish(
    url: str,
    exchange: str,
    key: str,
    msg,
    num_tiers: int = 5,
    headers=None,
    tls: TlsConfig | None = None,
    keyring=None,
) -> None:
    """Publish a message (or raw bytes) persistently with confirms; signed as its expected signer with a keyring."""
    body = msg if isinstance(msg, bytes) else wire.encode(msg)
    if keyring is not None:
        from fedat.protocol import signing

        headers = {**(headers or {}), **signing.sign(keyring, msg, body)}
    with channel(url, num_tiers, tls) as ch:
        ch.basic_publish(exchange, key, body, pika.BasicProperties(delivery_mode=2, headers=headers), mandatory=True)


def fetch(url: str, queue: str, timeout: float = 30.0, raw: bool = False, tls: TlsConfig | None = None):
    """Get one message from `queue` (ack it), waiting up to `timeout` seconds; None if nothing came."""
    deadline = time.time() + timeout
    conn = pika.BlockingConnection(parameters(url, tls))
    try:
        ch = conn.channel()
        while time.time() < deadline:
            method, props, body = ch.basic_get(queue, auto_ack=True)
            if method is not None:
                return (props, body) if raw else wire.decode(body)
            time.sleep(0.1)
        return None
    finally:
        conn.close()


@contextmanager
def tap(url: str, exchange: str, key: str = "", tls: TlsConfig | None = None):
    """A private unbounded queue on `exchange` for the block: yields get(timeout) -> the next message or None.

    The observers' queues are bounded (drop-head), so a test that reads slower than fast services publish would miss
    messages there; a tap sees every one, in order.
    """
    conn = pika.BlockingConnection(parameters(url, tls))
    try:
        ch = conn.channel()
        queue = ch.queue_declare("", exclusive=True, auto_delete=True).method.queue
        ch.queue_bind(queue, exchange, key)

        def get(timeout: float = 30.0):
            deadline = time.time() + timeout
            while time.time() < deadline:
                method, _, body = ch.basic_get(queue, auto_ack=True)
                if method is not None:
                    return wire.decode(body)
                conn.sleep(0.1)
            return None

        yield get
    finally:
        conn.close()


def attempt(conn: pika.BlockingConnection, fn) -> tuple[int, str] | None:
    """Run fn(channel) on a fresh confirm channel: None if the broker allowed it, (reply code, text) if it refused."""
    ch = conn.channel()
    ch.confirm_delivery()
    try:
        fn(ch)
    except pe.ChannelClosedByBroker as exc:
        return exc.reply_code, exc.reply_text
    except pe.UnroutableError:
        pass  # allowed, only nobody is bound to that key
    if ch.is_open:
        ch.close()
    return None


def fetch_n(url: str, queue: str, n: int, timeout: float = 30.0, tls: TlsConfig | None = None) -> list:
    """Get exactly n messages from `queue`, failing if fewer arrive in time."""
    out = []
    deadline = time.time() + timeout
    while len(out) < n:
        msg = fetch(url, queue, timeout=max(0.1, deadline - time.time()), tls=tls)
        assert msg is not None, f"only {len(out)} of {n} messages arrived on {queue} within {timeout}s"
        out.append(msg)
    return out


def queue_counts(url: str) -> dict[str, tuple[int, int]]:
    """Queue name -> (ready, unacknowledged), from rabbitmqctl."""
    r = subprocess.run(
        [
            "rabbitmqctl",
            "list_queues",
            "-q",
            "--no-table-headers",
            "-p",
            vhost_of(url),
            "name",
            "messages_ready",
            "messages_unacknowledged",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    out = {}
    for line in r.stdout.splitlines():
        parts = line.split()
        if len(parts) == 3:
            out[parts[0]] = (int(parts[1]), int(parts[2]))
    return out


def queue_types(url: str) -> dict[str, str]:
    """Queue name -> type (classic / quorum), from rabbitmqctl."""
    r = subprocess.run(
        ["rabbitmqctl", "list_queues", "-q", "--no-table-headers", "-p", vhost_of(url), "name", "type"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return dict(line.split()[:2] for line in r.stdout.splitlines() if len(line.split()) >= 2)


def close_connections(url: str) -> None:
    """Make the broker drop every client connection to the vhost (as a broker restart would)."""
    subprocess.run(
        ["rabbitmqctl", "close_all_connections", "-p", vhost_of(url), "test: broker drops clients"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )


def purge_all(url: str, num_tiers: int = 5) -> None:
    """Empty every queue of the topology (between tests sharing a vhost)."""
    with channel(url, num_tiers) as ch:
        for q in topology.queues(num_tiers):
            ch.queue_purge(q.name)


@contextmanager
def running(
    service,
    url: str,
    num_tiers: int,
    prefetch: int = 64,
    max_message_bytes: int = wire.MAX_MESSAGE_BYTES,
    tls: TlsConfig | None = None,
    persist: bool = True,
    keyring=None,
):
    """Run a service against the broker in a background thread for the duration of the block."""
    stop = threading.Event()
    cfg = BrokerConfig(
        url=url, num_tiers=num_tiers, prefetch=prefetch, max_message_bytes=max_message_bytes, tls=tls, keyring=keyring
    )
    metrics = transport_metrics(CollectorRegistry(), service.name)
    t = threading.Thread(
        target=run_service, args=(service, cfg, metrics, stop), kwargs={"persist": persist}, daemon=True
    )
    t.start()
    deadline = time.time() + 20
    while metrics.connected._value.get() != 1 and time.time() < deadline:
        time.sleep(0.05)
    try:
        yield metrics
    finally:
        stop.set()
        t.join(timeout=10)


def http_status(port: int, path: str) -> int:
    """The HTTP status of GET 127.0.0.1:port/path (a service's /healthz, /readyz); 0 while nothing listens."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return 0


def wait_for(predicate, timeout: float, what: str, every: float = 0.2):
    """Poll `predicate` until it returns something true (returned), or fail naming `what` after `timeout` s."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")

"""`python -m fedat.deploy.release_test`: does a fresh release work end to end? (the chart's `helm test` Pod)

Three checks, each printed with its outcome: the broker accepts the read-only recorder user's credentials and the
topology is provisioned; a global model (the seed's version 0, or any newer one) is in the recorder's copy of the
global models, fetched and requeued; every metrics endpoint named answers /metrics and reports a broker connection.
Exit 0 when all pass, 1 otherwise. It consumes nothing and writes nothing.
"""

from __future__ import annotations

import os
import re
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping

from fedat.errors import WireError
from fedat.protocol import topology, wire
from fedat.runtime import config
from fedat.runtime.bus import RECOVERABLE, BrokerConfig, close_quietly, connect
from fedat.runtime.tls import tls_from_env

CONNECTED = re.compile(r"^fedat_broker_connected 1(\.0)?$", re.M)


def newest_global(cfg: BrokerConfig) -> wire.GlobalModel | None:
    """A global model from the recorder's queue, put back at once; None if the queue holds none."""
    conn = connect(cfg)
    try:
        channel = conn.channel()
        channel.queue_declare(topology.RECORDER_GLOBAL, passive=True)  # provisioned, and this user may see it
        method, _, body = channel.basic_get(topology.RECORDER_GLOBAL, auto_ack=False)
        if method is None:
            return None
        channel.basic_nack(delivery_tag=method.delivery_tag, requeue=True)
        msg = wire.decode(body)
        if not isinstance(msg, wire.GlobalModel):
            raise WireError(f"{topology.RECORDER_GLOBAL} holds a {msg.kind}, not a global model")
        return msg
    finally:
        close_quietly(conn)


def scrape(url: str, timeout: float = 10.0) -> str:
    """The text of `url`'s /metrics."""
    with urllib.request.urlopen(f"{url.rstrip('/')}/metrics", timeout=timeout) as r:
        return r.read().decode(errors="replace")


def run_checks(
    cfg: BrokerConfig,
    metrics_urls: list[str],
    expect_global: bool,
    patience: float,
    out: Callable[[str], None] = print,
    sleep: Callable[[float], None] = time.sleep,
) -> bool:
    """Every check, in order, printing one line each; True when all passed."""
    ok = True
    deadline = time.monotonic() + patience
    model, error = None, ""
    while True:
        try:
            model, error = newest_global(cfg), ""
        except RECOVERABLE as exc:
            error = f"{type(exc).__name__}: {exc}"
        except WireError as exc:
            error = str(exc)
        if (model is not None or not expect_global) and not error or time.monotonic() >= deadline:
            break
        sleep(2.0)
    if error:
        out(f"FAIL broker: {error}")
        ok = False
    else:
        out("ok   broker: connected with the recorder's credentials; the topology is provisioned")
        if model is not None:
            out(f"ok   global model: version {model.version} ({len(model.layers)} layers)")
        elif expect_global:
            out(f"FAIL global model: none in {topology.RECORDER_GLOBAL} after {patience:.0f}s (did the seed Job run?)")
            ok = False
    for url in metrics_urls:
        try:
            text = scrape(url)
        except (urllib.error.URLError, OSError) as exc:
            out(f"FAIL metrics {url}: {getattr(exc, 'reason', exc)}")
            ok = False
            continue
        if CONNECTED.search(text):
            out(f"ok   metrics {url}: answering, connected to the broker")
        else:
            out(f"FAIL metrics {url}: answering, but fedat_broker_connected is not 1")
            ok = False
    return ok


def config_from_env(env: Mapping[str, str]) -> BrokerConfig:
    """Where the broker is, as whom: FEDAT_AMQP_URL_FILE (or FEDAT_AMQP_URL) and the FEDAT_TLS_* files."""
    return BrokerConfig(url=config.amqp_url(env), tls=tls_from_env(env))


def main() -> None:
    """Run the checks configured by the environment; exit 0 (all passed) or 1."""
    env = os.environ
    urls = [u.strip() for u in env.get("FEDAT_METRICS_URLS", "").split(",") if u.strip()]
    passed = run_checks(
        config_from_env(env),
        urls,
        expect_global=env.get("FEDAT_EXPECT_GLOBAL", "1") != "0",
        patience=float(env.get("FEDAT_TEST_PATIENCE", "120")),
    )
    sys.exit(0 if passed else 1)


if __name__ == "__main__":
    main()

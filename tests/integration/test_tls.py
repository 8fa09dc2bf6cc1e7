"""A tier round over mutual TLS on a private node, and the clients TLS must refuse."""

from __future__ import annotations

import time

import numpy as np
import pika
import pytest

from fedat.ops.devbroker import PrivateBroker, make_certificates
from fedat.protocol import topology
from fedat.protocol.wire import TierAssignment, decode_model
from fedat.runtime.tls import TlsConfig

from ..factories import SHAPES, answer, seed
from .broker import fetch, fetch_n, parameters, publish, running
from .test_pipeline import aggregator, barrier  # the same services as the plain pipeline test, whatever they take

pytestmark = pytest.mark.broker

VHOST = "fedat-tls"


@pytest.fixture(scope="module")
def node():
    with PrivateBroker(tls=True) as b:
        b.add_vhost(VHOST)
        yield b


def connections(node: PrivateBroker) -> list[list[str]]:
    """[ssl, peer certificate subject, server port] of each client connection to the test vhost."""
    out = node.ctl("list_connections", "-q", "--no-table-headers", "-p", VHOST, "ssl", "peer_cert_subject", "port")
    return [line.split("\t") for line in out.splitlines() if line.strip()]


def test_a_tier_round_over_mutual_tls_merges_exactly(node):
    url, tls = node.amqps_url(VHOST), node.tls_config()
    assert str(node.ssl_port) in url and str(node.port) not in url
    with running(barrier(clients_per_round=3, min_clients=3), url, 1, tls=tls), running(aggregator(), url, 1, tls=tls):
        clients = (0, 1, 2, 3)
        assignment = TierAssignment(
            id="a1", epoch=1, tiers=(clients,), latencies={c: 0.1 for c in clients}, created_at=time.time()
        )
        publish(url, topology.CONTROL, "", assignment, num_tiers=1, tls=tls)
        publish(url, topology.GLOBAL, "", seed(1, SHAPES, time.time()), num_tiers=1, tls=tls)
        tasks = fetch_n(url, topology.train_queue(1), 3, tls=tls)
        assert {t.round for t in tasks} == {1} and {t.version for t in tasks} == {0}
        assert len({t.client for t in tasks}) == 3
        for t in tasks:
            publish(url, topology.RESULTS, topology.tier_key(1), answer(t, float(t.client), t.client + 1), 1, tls=tls)
        # A redelivered copy of the first answer: counted once.
        publish(url, topology.RESULTS, topology.tier_key(1), answer(tasks[0], 99.0, 1000), 1, tls=tls)
        g = fetch(url, topology.RECORDER_GLOBAL, tls=tls)
        while g is not None and g.version == 0:
            g = fetch(url, topology.RECORDER_GLOBAL, tls=tls)
        assert g is not None and g.version == 1 and g.updates == 3 and g.tier_counts == (1,)
        n = np.array([t.client + 1 for t in tasks], float)
        expected = float((n * np.array([t.client for t in tasks])).sum() / n.sum())
        for layer in decode_model(g.layers):
            np.testing.assert_allclose(layer, expected, rtol=1e-6)
        # The services' connections are TLS on the TLS port, authenticated by the client certificate.
        conns = connections(node)
        assert len(conns) >= 2, conns
        assert all(c == ["true", "CN=fedat-test-client", str(node.ssl_port)] for c in conns), conns


def refused(url: str, tls: TlsConfig | None) -> Exception:
    """The error of a connection attempt that must fail."""
    with pytest.raises((pika.exceptions.AMQPConnectionError, OSError)) as info:
        pika.BlockingConnection(parameters(url, tls)).close()
    return info.value


def test_a_client_without_a_certificate_is_refused(node):
    err = refused(node.amqps_url(VHOST), TlsConfig(node.ca_file, server_hostname="localhost"))
    assert isinstance(err, pika.exceptions.AMQPConnectionError)
    # The broker, not the client, ended it: it requires a peer certificate.
    deadline = time.time() + 10
    while "certificate_required" not in (node.dir / "log" / f"{node.node}.log").read_text():
        assert time.time() < deadline, "the broker logged no refused client certificate"
        time.sleep(0.2)


def test_a_client_trusting_another_ca_fails_verification(node, tmp_path):
    other = make_certificates(tmp_path, ca_name="some-other-ca")
    err = refused(node.amqps_url(VHOST), TlsConfig(str(other["ca"]), node.client_cert, node.client_key, "localhost"))
    assert "CERTIFICATE_VERIFY_FAILED" in str(err)


def test_a_client_expecting_another_name_fails_verification(node):
    err = refused(node.amqps_url(VHOST), TlsConfig(node.ca_file, node.client_cert, node.client_key, "broker.example"))
    assert "CERTIFICATE_VERIFY_FAILED" in str(err) and "Hostname mismatch" in str(err)


def test_plain_amqp_on_the_tls_port_is_refused(node):
    refused(f"amqp://guest:guest@127.0.0.1:{node.ssl_port}/{VHOST}", None)
    # ...while the node's plain port answers: the round above did not go through it by accident.
    conn = pika.BlockingConnection(pika.URLParameters(node.amqp_url(VHOST)))
    assert conn.is_open
    conn.close()

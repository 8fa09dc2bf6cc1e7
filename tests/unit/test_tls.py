"""TLS settings from the environment: off without a CA, complete or refused, and checked before any connection."""

from __future__ import annotations

import ssl

import pytest

from fedat.ops.devbroker import make_certificates
from fedat.runtime.tls import TlsConfig, ssl_options, tls_from_env


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return {k: str(v) for k, v in make_certificates(tmp_path_factory.mktemp("certs")).items()}


def test_no_ca_file_means_no_tls():
    assert tls_from_env({}) is None
    assert tls_from_env({"FEDAT_TLS_CA_FILE": "  ", "FEDAT_TLS_SERVER_NAME": "localhost"}) is None


def test_every_setting_is_read(certs):
    env = {
        "FEDAT_TLS_CA_FILE": certs["ca"],
        "FEDAT_TLS_CERT_FILE": certs["client_cert"],
        "FEDAT_TLS_KEY_FILE": certs["client_key"],
        "FEDAT_TLS_SERVER_NAME": "localhost",
    }
    assert tls_from_env(env) == TlsConfig(certs["ca"], certs["client_cert"], certs["client_key"], "localhost")


def test_a_ca_alone_is_server_authentication_only(certs):
    assert tls_from_env({"FEDAT_TLS_CA_FILE": certs["ca"]}) == TlsConfig(certs["ca"])


def test_the_process_environment_is_the_default(certs, monkeypatch):
    monkeypatch.setenv("FEDAT_TLS_CA_FILE", certs["ca"])
    monkeypatch.setenv("FEDAT_TLS_SERVER_NAME", "broker.internal")
    assert tls_from_env() == TlsConfig(certs["ca"], server_hostname="broker.internal")
    monkeypatch.delenv("FEDAT_TLS_CA_FILE")
    assert tls_from_env() is None


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"FEDAT_TLS_CERT_FILE": "client_cert", "FEDAT_TLS_KEY_FILE": "client_key"}, "FEDAT_TLS_CA_FILE is not"),
        ({"FEDAT_TLS_CA_FILE": "ca", "FEDAT_TLS_KEY_FILE": "client_key"}, "without FEDAT_TLS_CERT_FILE"),
        ({"FEDAT_TLS_CA_FILE": "/nonexistent/ca.pem"}, "FEDAT_TLS_CA_FILE=/nonexistent/ca.pem: no such file"),
        ({"FEDAT_TLS_CA_FILE": "server_key"}, "do not load"),  # a key is no CA certificate
        (  # a key that does not belong to the certificate
            {"FEDAT_TLS_CA_FILE": "ca", "FEDAT_TLS_CERT_FILE": "client_cert", "FEDAT_TLS_KEY_FILE": "server_key"},
            "do not load",
        ),
    ],
)
def test_an_incomplete_or_broken_setup_is_refused_at_once(certs, env, message):
    env = {k: certs.get(v, v) for k, v in env.items()}
    with pytest.raises(ValueError, match=message):
        tls_from_env(env)


def test_the_context_verifies_the_broker(certs):
    opts = ssl_options(TlsConfig(certs["ca"], certs["client_cert"], certs["client_key"], "localhost"))
    assert opts.context.verify_mode == ssl.CERT_REQUIRED and opts.context.check_hostname
    assert opts.context.minimum_version == ssl.TLSVersion.TLSv1_2
    assert opts.server_hostname == "localhost"

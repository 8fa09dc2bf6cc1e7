"""TLS to the broker (amqps://): which CA to trust and, for mutual TLS, the client's certificate and key."""

from __future__ import annotations

import ssl
from dataclasses import dataclass

import pika


@dataclass(frozen=True)
class TlsConfig:
    """Files of the trust anchor and (optionally) the client identity; `server_hostname` checks the broker's name."""

    ca_file: str
    cert_file: str = ""
    key_file: str = ""
    server_hostname: str = ""


def ssl_options(cfg: TlsConfig) -> pika.SSLOptions:
    """A verifying TLS context for pika: the broker's certificate must chain to the CA (TLS 1.2 or newer)."""
    context = ssl.create_default_context(cafile=cfg.ca_file)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if cfg.cert_file:
        context.load_cert_chain(cfg.cert_file, cfg.key_file or None)
    context.check_hostname = bool(cfg.server_hostname)
    return pika.SSLOptions(context, cfg.server_hostname or None)

"""TLS to the broker (amqps://): which CA to trust and, for mutual TLS, the client's certificate and key."""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping
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


def tls_from_env(env: Mapping[str, str] | None = None) -> TlsConfig | None:
    """TLS settings from FEDAT_TLS_CA_FILE, _CERT_FILE, _KEY_FILE and _SERVER_NAME; None when no CA file is set."""
    env = os.environ if env is None else env
    ca, cert, key, name = (
        env.get(f"FEDAT_TLS_{k}", "").strip() for k in ("CA_FILE", "CERT_FILE", "KEY_FILE", "SERVER_NAME")
    )
    if not ca:
        # A client identity without a trust anchor is a half-done setup: refuse it rather than silently go plain.
        if cert or key:
            raise ValueError("FEDAT_TLS_CERT_FILE/FEDAT_TLS_KEY_FILE are set but FEDAT_TLS_CA_FILE is not")
        return None
    if key and not cert:
        raise ValueError("FEDAT_TLS_KEY_FILE is set without FEDAT_TLS_CERT_FILE")
    for var, path in (("FEDAT_TLS_CA_FILE", ca), ("FEDAT_TLS_CERT_FILE", cert), ("FEDAT_TLS_KEY_FILE", key)):
        if path and not os.path.isfile(path):
            raise ValueError(f"{var}={path}: no such file")
    cfg = TlsConfig(ca_file=ca, cert_file=cert, key_file=key, server_hostname=name)
    # Build the context once now: a bad file would otherwise surface at connect time as an OSError, which the
    # bus treats as a lost broker and retries forever.
    try:
        ssl_options(cfg)
    except ssl.SSLError as exc:
        raise ValueError(f"TLS files from FEDAT_TLS_* do not load: {exc}") from exc
    return cfg

"""What the benchmarks read over HTTP: the local broker's management API and a service's /metrics."""

from __future__ import annotations

import base64
import urllib.request

API = "http://127.0.0.1:15672/api"  # the local broker's management API (guest)


def get(url: str, auth: bool = False, timeout: float = 10.0) -> bytes:
    """The body at `url`; `auth` sends the local broker's guest credentials."""
    req = urllib.request.Request(url)
    if auth:
        req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.read()


def metrics(port: int) -> str:
    """A local service's /metrics text, or "" while it does not answer."""
    try:
        return get(f"http://127.0.0.1:{port}/metrics").decode()
    except OSError:
        return ""

"""Vhost life cycle on the local broker (rabbitmqctl): each run and each test session gets its own."""

from __future__ import annotations

import subprocess
from urllib.parse import quote

HOST = "127.0.0.1:5672"


def _ctl(*args: str) -> None:
    r = subprocess.run(["rabbitmqctl", *args], capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise RuntimeError(f"rabbitmqctl {' '.join(args)} failed: {r.stderr.strip() or r.stdout.strip()}")


def create_vhost(name: str, user: str = "guest", password: str = "guest") -> str:
    """Create `name`, grant `user` everything on it, and return its AMQP URL."""
    _ctl("add_vhost", name)
    _ctl("set_permissions", "-p", name, user, ".*", ".*", ".*")
    return f"amqp://{user}:{password}@{HOST}/{quote(name, safe='')}"


def delete_vhost(name: str) -> None:
    """Delete `name` and everything in it."""
    _ctl("delete_vhost", name)

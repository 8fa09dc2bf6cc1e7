"""Vhost life cycle on the local broker (management HTTP API): each run and each test session gets its own.

Through the HTTP API rather than `rabbitmqctl`: each `rabbitmqctl` call boots an Erlang VM (~0.7 s here), the API
answers in milliseconds, and `infra/ensure-broker.sh` enables its plugin wherever a broker is started.
"""

from __future__ import annotations

from urllib.parse import quote

from fedat.deploy.provision import DEFAULT_API_URL, ManagementApi

HOST = "127.0.0.1:5672"


def _api(user: str = "guest", password: str = "guest") -> ManagementApi:
    return ManagementApi(DEFAULT_API_URL, user, password)


def create_vhost(name: str, user: str = "guest", password: str = "guest") -> str:
    """Create `name`, grant `user` everything on it, and return its AMQP URL."""
    api, vhost = _api(user, password), quote(name, safe="")
    api.call("PUT", f"vhosts/{vhost}", {})
    api.call("PUT", f"permissions/{vhost}/{quote(user, safe='')}", {"configure": ".*", "write": ".*", "read": ".*"})
    return f"amqp://{user}:{password}@{HOST}/{vhost}"


def delete_vhost(name: str) -> None:
    """Delete `name` and everything in it (nothing to do if it is gone)."""
    _api().call("DELETE", f"vhosts/{quote(name, safe='')}", missing_ok=True)


def open_connections(name: str) -> int:
    """How many connections are open on vhost `name`."""
    return len(_api().call("GET", f"vhosts/{quote(name, safe='')}/connections") or [])

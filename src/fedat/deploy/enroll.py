"""Enrolling and revoking one real client, through the management HTTP API (as `fedat.deploy.provision` does).

`enroll` makes client K's broker user (`<prefix>client-<K>`, the prefix `<vhost>-` by default, as provisioning names
its users) with the permissions of `fedat.deploy.roles.client_role`, declares its two queues as the administrator
(`fedat.protocol.topology.client_queues`), and writes the one folder a site is handed: its AMQP URL (password
inside) and its keyring, each mode 0600, a `client.env` naming them, and the broker's CA with TLS. The folder is
written before the broker is touched and its password kept, so enrolling again, or after a failure half-way,
changes nothing. `revoke` deletes the user, closes its connections, and publishes the client's `leave` with reason
`revoked`, signed with its key, so that the profiler drops it at once and refuses it from then on; its queues stay
until `purge`. `docs/wire-format.md` §11 describes the folder and the permissions.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

from fedat.deploy import provision as prov
from fedat.deploy.roles import client_role
from fedat.errors import ProvisionError
from fedat.protocol import ids, signing, topology, wire

ENV_FILE = "client.env"
URL_FILE = "amqp-url"
KEYRING_FILE = "keyring.json"
CA_FILE = "ca.pem"
AMQPS_PORT = 5671


@dataclass(frozen=True)
class Enrolled:
    """What `enroll` made: the client, its broker user and the folder to hand over."""

    client: int
    username: str
    folder: Path


def username(prefix: str, client: int) -> str:
    """Client K's broker user: `<prefix>client-<K>` (the prefix is `<vhost>-` unless a deployment chose another)."""
    return f"{prefix}{topology.client_key(client)}"


def _vhost_ready(api: prov.ManagementApi, vhost: str) -> None:
    """The vhost and the exchanges a client's queues are bound to exist, or ProvisionError says what to do."""
    if api.call("GET", f"vhosts/{prov._q(vhost)}", missing_ok=True) is None:
        raise ProvisionError(f"vhost {vhost} does not exist: provision the deployment first (fedat provision)")
    for exchange in (topology.TRAIN, topology.EVALUATE, topology.RESULTS):
        if api.call("GET", f"exchanges/{prov._q(vhost)}/{prov._q(exchange)}", missing_ok=True) is None:
            raise ProvisionError(
                f"exchange {exchange} does not exist in vhost {vhost}: provision its topology first (fedat provision)"
            )


def _write_private(path: Path, text: str, mode: int = 0o600) -> None:
    """Write `text` to `path` with `mode` from the first byte (never readable by others, not even for a moment)."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _password(folder: Path, user: str) -> str:
    """The password of an earlier enrollment into `folder` (so that enrolling again changes nothing), or a new one."""
    url = folder / URL_FILE
    if url.is_file():
        p = urlparse(url.read_text().strip())
        if p.username is not None and unquote(p.username) == user and p.password:
            return unquote(p.password)
    return secrets.token_urlsafe(24)


def client_env(client: int, vhost: str, num_tiers: int, tls: bool, extra: Mapping[str, str] = {}) -> str:
    """The text of `client.env` (`docs/wire-format.md` §11.1): paths relative to its folder."""
    lines = [
        f"# FedAT client {client} of vhost {vhost}, enrolled by `fedat enroll`; paths are relative to this folder",
        f"FEDAT_CLIENT_ID={client}",
        f"FEDAT_AMQP_URL_FILE={URL_FILE}",
        f"FEDAT_KEYRING_FILE={KEYRING_FILE}",
        f"FEDAT_NUM_TIERS={num_tiers}",
        "FEDAT_DECLARE_TOPOLOGY=0",  # its user may not: the queues exist from enrollment on
    ]
    if tls:
        lines.append(f"FEDAT_TLS_CA_FILE={CA_FILE}")
    lines += [f"{k}={v}" for k, v in extra.items()]
    return "\n".join(lines) + "\n"


def enroll(
    api_url: str,
    admin_user: str,
    admin_password: str,
    vhost: str,
    client: int,
    secret: bytes,
    out: Path,
    *,
    num_tiers: int,
    prefix: str | None = None,
    amqp_host: str | None = None,
    ca_file: Path | None = None,
    extra: Mapping[str, str] = {},
    report: prov.Report = prov._no_report,
) -> Enrolled:
    """Enroll client `client` on `vhost`: its user, permissions and queues, and the folder `out` (see the module)."""
    role = client_role(client)  # refuses a negative id
    keys = signing.keys_for_role(secret, role.name)  # refuses a short secret, before anything is made
    if ca_file is not None and not ca_file.is_file():
        raise ProvisionError(f"--tls-ca-file {ca_file}: no such file")
    api = prov.ManagementApi(api_url, admin_user, admin_password)
    _vhost_ready(api, vhost)
    user = username(f"{vhost}-" if prefix is None else prefix, client)
    if user == admin_user:
        raise ProvisionError(f"client {client}: user {user!r} is the administrator's; give another --user-prefix")
    out.mkdir(parents=True, exist_ok=True)
    out.chmod(0o700)
    password = _password(out, user)
    host = amqp_host or f"{urlparse(api_url).hostname or '127.0.0.1'}:{AMQPS_PORT if ca_file else prov.AMQP_PORT}"
    url = prov.amqp_url(host, vhost, user, password, scheme="amqps" if ca_file else "amqp")
    # The folder first: a failure below is retried with the same password.
    _write_private(out / URL_FILE, url + "\n")
    _write_private(out / KEYRING_FILE, json.dumps(keys) + "\n")
    if ca_file is not None:
        shutil.copyfile(ca_file, out / CA_FILE)
        (out / CA_FILE).chmod(0o644)
    _write_private(out / ENV_FILE, client_env(client, vhost, num_tiers, ca_file is not None, extra))
    for queue in topology.client_queues(client):
        prov._ensure_queue(api, vhost, queue.name, dict(queue.arguments), report)
        for exchange, key in queue.bindings:
            prov._ensure_binding(api, vhost, exchange, queue.name, key, report)
    prov._ensure_user(api, user, password, role.tags, role.name, report)
    prov._ensure_permissions(api, vhost, user, role.permissions(), report)
    prov._ensure_topic_permissions(api, vhost, user, role, report)
    return Enrolled(client, user, out)


def close_connection(api: prov.ManagementApi, name: str, tries: int = 5, pause: float = 0.2) -> None:
    """Close a connection; one that closes meanwhile is fine. RabbitMQ closes a deleted user's connections itself,
    and a DELETE that meets one closing answers 500 rather than 404 (seen on 3.10)."""
    path = f"connections/{prov._q(name)}"
    for attempt in range(1, tries + 1):
        try:
            api.call("DELETE", path, missing_ok=True)
            return
        except ProvisionError:
            if api.call("GET", path, missing_ok=True) is None:
                return
            if attempt == tries:
                raise
            time.sleep(pause * attempt)


def revoke(
    api_url: str,
    admin_user: str,
    admin_password: str,
    vhost: str,
    client: int,
    secret: bytes,
    *,
    prefix: str | None = None,
    purge: bool = False,
    now: float | None = None,
    report: prov.Report = prov._no_report,
) -> None:
    """Revoke client `client`: delete its user, close its connections, tell the profiler; `purge`: its queues too.

    Idempotent: a user already deleted is fine, and the profiler takes a second `leave` of a revoked client as a
    copy."""
    keyring = signing.Keyring.from_mapping(signing.keys_for_role(secret, client_role(client).name))
    api = prov.ManagementApi(api_url, admin_user, admin_password)
    _vhost_ready(api, vhost)
    user = username(f"{vhost}-" if prefix is None else prefix, client)
    if user == admin_user:
        raise ProvisionError(f"client {client}: user {user!r} is the administrator's; give the right --user-prefix")
    path = f"users/{prov._q(user)}"
    # The user first, so that it cannot connect again (RabbitMQ closes its connections then, CONNECTION_FORCED);
    # then any connection the management API still lists, for a broker that does not.
    if api.call("GET", path, missing_ok=True) is None:
        report("absent", f"user {user}")
    else:
        api.call("DELETE", path, missing_ok=True)
        report("deleted", f"user {user}")
    for conn in api.call("GET", f"vhosts/{prov._q(vhost)}/connections") or ():
        if conn.get("user") == user:
            close_connection(api, conn["name"])
            report("deleted", f"connection {conn['name']} of {user}")
    _publish_leave(api, vhost, client, keyring, time.time() if now is None else now)
    report("created", f"leave (revoked) of client {client} for the profiler")
    if purge:
        for queue in topology.client_queues(client):
            qpath = f"queues/{prov._q(vhost)}/{prov._q(queue.name)}"
            gone = api.call("GET", qpath, missing_ok=True) is None
            if not gone:
                api.call("DELETE", qpath, missing_ok=True)
            report("absent" if gone else "deleted", f"queue {queue.name}")


def _publish_leave(api: prov.ManagementApi, vhost: str, client: int, keyring: signing.Keyring, now: float) -> None:
    """Publish the client's signed `leave` (reason revoked) to the results exchange, with its own routing key."""
    msg = wire.Leave(id=ids.revocation(client), client=client, reason="revoked", sent_at=now)
    body = wire.encode(msg)
    headers = signing.sign(keyring, msg, body)
    answer = api.call(
        "POST",
        f"exchanges/{prov._q(vhost)}/{prov._q(topology.RESULTS)}/publish",
        {
            "routing_key": topology.from_client(topology.LEAVE_KEY, client),
            "payload": base64.b64encode(body).decode(),
            "payload_encoding": "base64",
            "properties": {
                "delivery_mode": 2,
                "content_type": "application/msgpack",
                "message_id": msg.id,
                "type": msg.kind,
                "headers": headers,
            },
        },
    )
    if not (answer or {}).get("routed"):
        raise ProvisionError(
            f"the revocation of client {client} reached no queue in vhost {vhost}: is {topology.PROFILER_MEMBERS} "
            "provisioned (fedat provision)?"
        )

"""Provision a FedAT deployment on RabbitMQ through the management HTTP API: vhost, least-privilege users, topology.

`provision` creates (or checks) the vhost, one user per role with the permissions and topic permissions of
`fedat.deploy.roles`, and the whole topology (its policies, every exchange, queue with its arguments, and binding),
then returns each role's AMQP URL. It reads before it writes, so running it again changes nothing; a queue or
exchange that exists with other arguments fails with both argument sets named (RabbitMQ would refuse to redeclare it
anyway), while a policy that differs is updated in place.
`deprovision` deletes the vhost (with everything in it) and the users. Only the standard library is used.

Passwords never reach a log or an error message: they come from a file per role or are generated, and are
written only to a credentials file of mode 0600.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import secrets
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlparse

from fedat.deploy import roles as roles_mod
from fedat.errors import ProvisionError  # noqa: F401 (re-exported)
from fedat.protocol import topology

DEFAULT_API_URL = "http://127.0.0.1:15672"
AMQP_PORT = 5672


def _q(segment: str) -> str:
    return quote(segment, safe="")


class ManagementApi:
    """A minimal client of the RabbitMQ management HTTP API (basic auth, JSON)."""

    def __init__(self, api_url: str, user: str, password: str, timeout: float = 30.0):
        self.base = api_url.rstrip("/")
        self.timeout = timeout
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        self._headers = {"Authorization": f"Basic {token}", "Content-Type": "application/json"}

    def call(self, method: str, path: str, body: Any = None, missing_ok: bool = False) -> Any:
        """`method` on /api/`path`; the decoded JSON answer, or None (no content, or 404 with missing_ok)."""
        url = f"{self.base}/api/{path}"
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(url, data=data, method=method, headers=self._headers)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as r:
                raw = r.read()
        except urllib.error.HTTPError as exc:
            if exc.code == 404 and missing_ok:
                return None
            answer = exc.read().decode(errors="replace").strip()[:2000]
            # The request body (it may hold a password) is never part of the message.
            raise ProvisionError(f"{method} /api/{path} failed: HTTP {exc.code} {exc.reason}: {answer}") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise ProvisionError(
                f"{method} /api/{path}: the management API at {self.base} does not answer ({reason}); "
                "is the rabbitmq_management plugin enabled (infra/ensure-broker.sh)?"
            ) from None
        return json.loads(raw) if raw.strip() else None


def _password_matches(user: Mapping[str, Any], password: str) -> bool:
    """Whether `password` is the one RabbitMQ stored (salted SHA-256/512 as the internal backend hashes it)."""
    algo = {"rabbit_password_hashing_sha256": hashlib.sha256, "rabbit_password_hashing_sha512": hashlib.sha512}.get(
        user.get("hashing_algorithm", "")
    )
    if algo is None or not user.get("password_hash"):
        return False
    stored = base64.b64decode(user["password_hash"])
    salt, digest = stored[:4], stored[4:]
    return secrets.compare_digest(algo(salt + password.encode()).digest(), digest)


def _tags(value: Any) -> set[str]:
    if isinstance(value, str):
        return {t.strip() for t in value.split(",") if t.strip()}
    return set(value or ())


def amqp_url(host: str, vhost: str, username: str, password: str, scheme: str = "amqp") -> str:
    """The AMQP URL of `username` on `vhost` at host[:port]."""
    return f"{scheme}://{_q(username)}:{_q(password)}@{host}/{_q(vhost)}"


def redact(url: str) -> str:
    """An AMQP URL with its password replaced by ***."""
    p = urlparse(url)
    if p.password is None:
        return url
    userinfo, host = p.netloc.rsplit("@", 1)
    return p._replace(netloc=f"{userinfo.split(':', 1)[0]}:***@{host}").geturl()


Report = Callable[[str, str], None]  # (outcome: created / updated / unchanged / deleted / absent, what)


def _no_report(outcome: str, what: str) -> None:
    pass


def provision(
    api_url: str,
    admin_user: str,
    admin_password: str,
    vhost: str,
    num_tiers: int,
    users: Mapping[str, tuple[str, str]],
    *,
    amqp_host: str | None = None,
    report: Report = _no_report,
) -> dict[str, str]:
    """Create or check the vhost, the users of `users` (role -> (username, password)) and the topology.

    Returns role -> AMQP URL (host `amqp_host`, default: the API's host name and port 5672). `report` is called
    with each object's outcome; it never sees a password."""
    all_roles = roles_mod.roles(num_tiers)
    unknown = sorted(set(users) - set(all_roles))
    if unknown:
        raise ValueError(f"unknown role(s) {unknown}; roles: {', '.join(all_roles)}")
    for role, (username, _) in users.items():
        if username == admin_user:
            raise ValueError(f"role {role}: user {username!r} is the provisioning user; give it another name")
    api = ManagementApi(api_url, admin_user, admin_password)
    v = _q(vhost)

    if api.call("GET", f"vhosts/{v}", missing_ok=True) is None:
        api.call("PUT", f"vhosts/{v}", {"description": "FedAT deployment (fedat provision)"})
        report("created", f"vhost {vhost}")
    else:
        report("unchanged", f"vhost {vhost}")
    # The provisioner declares the topology, so it needs every permission on the vhost (an API-created vhost grants
    # them to its creator; a vhost made otherwise may not).
    _ensure_permissions(api, vhost, admin_user, all_roles[roles_mod.ADMIN].permissions(), report)

    for name, kind in topology.EXCHANGES.items():
        _ensure_exchange(api, vhost, name, kind, report)
    # Policies first: they apply to the queues as they are declared, and change in place on a deployment that has
    # them already (a queue's arguments cannot).
    for policy in topology.POLICIES:
        _ensure_policy(api, vhost, policy, report)
    for queue in topology.queues(num_tiers):
        _ensure_queue(api, vhost, queue.name, dict(queue.arguments), report)
        for exchange, key in queue.bindings:
            _ensure_binding(api, vhost, exchange, queue.name, key, report)

    # Users last: none of them can connect to a vhost whose topology is not complete yet.
    for role, (username, password) in users.items():
        r = all_roles[role]
        _ensure_user(api, username, password, r.tags, role, report)
        _ensure_permissions(api, vhost, username, r.permissions(), report)
        _ensure_topic_permissions(api, vhost, username, r, report)

    return role_urls(api_url, vhost, users, amqp_host)


def role_urls(
    api_url: str, vhost: str, users: Mapping[str, tuple[str, str]], amqp_host: str | None = None
) -> dict[str, str]:
    """role -> AMQP URL; the host is `amqp_host` or the management API's host name with port 5672."""
    host = amqp_host or f"{urlparse(api_url).hostname or '127.0.0.1'}:{AMQP_PORT}"
    return {role: amqp_url(host, vhost, username, password) for role, (username, password) in users.items()}


def _ensure_user(api: ManagementApi, name: str, password: str, tags: Iterable[str], role: str, report: Report) -> None:
    existing = api.call("GET", f"users/{_q(name)}", missing_ok=True)
    body = {"password": password, "tags": ",".join(tags)}
    if existing is None:
        api.call("PUT", f"users/{_q(name)}", body)
        report("created", f"user {name} (role {role}, tags [{', '.join(tags)}])")
    elif _tags(existing.get("tags")) != set(tags) or not _password_matches(existing, password):
        api.call("PUT", f"users/{_q(name)}", body)
        report("updated", f"user {name} (role {role}, password and tags [{', '.join(tags)}])")
    else:
        report("unchanged", f"user {name} (role {role})")


def _ensure_permissions(api: ManagementApi, vhost: str, user: str, wanted: dict[str, str], report: Report) -> None:
    path = f"permissions/{_q(vhost)}/{_q(user)}"
    existing = api.call("GET", path, missing_ok=True)
    what = f"permissions of {user} on {vhost}: " + " ".join(f"{k} {wanted[k]}" for k in ("configure", "write", "read"))
    if existing is not None and all(existing.get(k) == wanted[k] for k in wanted):
        report("unchanged", what)
        return
    api.call("PUT", path, wanted)
    report("created" if existing is None else "updated", what)


def _ensure_topic_permissions(api: ManagementApi, vhost: str, user: str, role: roles_mod.Role, report: Report) -> None:
    path = f"topic-permissions/{_q(vhost)}/{_q(user)}"
    existing = {(p["exchange"], p.get("write"), p.get("read")) for p in api.call("GET", path, missing_ok=True) or ()}
    wanted = {(t.exchange, t.write, t.read) for t in role.topic}
    if existing == wanted:
        if wanted:
            report("unchanged", f"topic permissions of {user} on {len(wanted)} exchanges")
        return
    if {x for x, _, _ in existing} - {x for x, _, _ in wanted}:
        api.call("DELETE", path)  # the 3.10 API deletes a user's topic permissions on a vhost only all at once
        existing = set()
    for exchange, write, read in sorted(wanted - existing):
        api.call("PUT", path, {"exchange": exchange, "write": write, "read": read})
        report("created", f"topic permission of {user} on {exchange}: write {write} read {read}")


def _ensure_exchange(api: ManagementApi, vhost: str, name: str, kind: str, report: Report) -> None:
    path = f"exchanges/{_q(vhost)}/{_q(name)}"
    wanted = {"type": kind, "durable": True, "auto_delete": False, "internal": False, "arguments": {}}
    existing = api.call("GET", path, missing_ok=True)
    if existing is None:
        api.call("PUT", path, wanted)
        report("created", f"exchange {name} ({kind})")
        return
    found = {k: existing.get(k) for k in wanted}
    if found != wanted:
        raise ProvisionError(
            f"exchange {name} in vhost {vhost} exists with {json.dumps(found, sort_keys=True)}; the topology wants "
            f"{json.dumps(wanted, sort_keys=True)}. Delete it (or the vhost) to provision it again."
        )
    report("unchanged", f"exchange {name}")


def _ensure_queue(api: ManagementApi, vhost: str, name: str, arguments: dict[str, Any], report: Report) -> None:
    path = f"queues/{_q(vhost)}/{_q(name)}"
    existing = api.call("GET", path, missing_ok=True)
    if existing is None:
        api.call("PUT", path, {"durable": True, "auto_delete": False, "arguments": arguments})
        report("created", f"queue {name} {json.dumps(arguments, sort_keys=True)}")
        return
    found = existing.get("arguments") or {}
    if found != arguments or not existing.get("durable") or existing.get("auto_delete"):
        raise ProvisionError(
            f"queue {name} in vhost {vhost} exists with arguments {json.dumps(found, sort_keys=True)} "
            f"(durable {existing.get('durable')}, auto_delete {existing.get('auto_delete')}); the topology wants "
            f"{json.dumps(arguments, sort_keys=True)} (durable). RabbitMQ cannot change a queue's arguments: delete "
            "the queue (losing its messages) or the vhost, then provision again."
        )
    report("unchanged", f"queue {name}")


def _ensure_policy(api: ManagementApi, vhost: str, policy: topology.Policy, report: Report) -> None:
    path = f"policies/{_q(vhost)}/{_q(policy.name)}"
    wanted = {
        "pattern": policy.pattern,
        "definition": policy.definition,
        "priority": policy.priority,
        "apply-to": policy.apply_to,
    }
    existing = api.call("GET", path, missing_ok=True)
    if existing is not None and {k: existing.get(k) for k in wanted} == wanted:
        report("unchanged", f"policy {policy.name}")
        return
    api.call("PUT", path, wanted)
    report("created" if existing is None else "updated", f"policy {policy.name} {json.dumps(wanted, sort_keys=True)}")


def _ensure_binding(api: ManagementApi, vhost: str, exchange: str, queue: str, key: str, report: Report) -> None:
    path = f"bindings/{_q(vhost)}/e/{_q(exchange)}/q/{_q(queue)}"
    what = f"binding {exchange} --{key or '(no key)'}--> {queue}"
    existing = api.call("GET", path, missing_ok=True) or []
    if any(b.get("routing_key") == key and not b.get("arguments") for b in existing):
        report("unchanged", what)
        return
    api.call("POST", path, {"routing_key": key, "arguments": {}})
    report("created", what)


def deprovision(
    api_url: str,
    admin_user: str,
    admin_password: str,
    vhost: str,
    usernames: Iterable[str],
    *,
    report: Report = _no_report,
) -> None:
    """Delete the vhost (queues, messages, permissions) and the users; what is already gone is fine."""
    api = ManagementApi(api_url, admin_user, admin_password)
    errors = []
    targets = [(f"vhosts/{_q(vhost)}", f"vhost {vhost}")]
    targets += [(f"users/{_q(u)}", f"user {u}") for u in usernames if u != admin_user]
    for path, what in targets:
        try:
            gone = api.call("GET", path, missing_ok=True) is None
            if not gone:
                api.call("DELETE", path, missing_ok=True)
            report("absent" if gone else "deleted", what)
        except ProvisionError as exc:  # keep going: delete as much as possible, then say what failed
            errors.append(str(exc))
    if errors:
        raise ProvisionError("; ".join(errors))


# --- passwords and the credentials file -------------------------------------------------------------------------


def usernames(prefix: str, roles: Iterable[str]) -> dict[str, str]:
    """role -> `<prefix><role>`."""
    return {role: f"{prefix}{role}" for role in roles}


def read_credentials(path: str | Path) -> dict[str, dict[str, str]]:
    """A credentials file written by `write_credentials` (role -> username, password, amqp_url); {} if absent."""
    p = Path(path)
    if not p.exists():
        return {}
    data = json.loads(p.read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{p}: not a credentials file (expected a JSON map of roles)")
    return data


def write_credentials(path: str | Path, credentials: Mapping[str, Mapping[str, str]]) -> None:
    """Write role -> {username, password, amqp_url} as JSON, mode 0600 from the first byte, atomically."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.")  # mkstemp creates it with mode 0600
    try:
        with os.fdopen(fd, "w") as f:
            os.fchmod(f.fileno(), 0o600)
            json.dump(credentials, f, indent=2, sort_keys=True)
            f.write("\n")
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def passwords(
    roles: Iterable[str],
    password_dir: str | Path | None = None,
    previous: Mapping[str, Mapping[str, str]] | None = None,
) -> dict[str, str]:
    """role -> password: the file `<password_dir>/<role>` if it exists (stripped), else the password of an earlier
    credentials file (so that provisioning again is a no-op), else a new `secrets.token_urlsafe(24)`."""
    out = {}
    for role in roles:
        f = Path(password_dir) / role if password_dir else None
        if f is not None and f.is_file():
            pw = f.read_text().strip()
            if not pw:
                raise ValueError(f"password file {f} is empty")
            out[role] = pw
        elif previous and role in previous and previous[role].get("password"):
            out[role] = previous[role]["password"]
        else:
            out[role] = secrets.token_urlsafe(24)
    return out

"""`python -m fedat.deploy.upgrade_check`: before an upgrade or a rollback changes anything, refuse new settings that
the run's checkpoints do not fit.

For each durable service it compares what its checkpoints are valid for (`fedat.protocol.fingerprint`) with what
the new release's process would be valid for: this code's state versions and the FEDAT_* settings in this
process's environment (the chart renders the new values into the hook Job). Where the service runs, its
/fingerprint endpoint says what it writes. Where it has no pod (its headless Service's name does not resolve),
nothing writes its checkpoint, and the checkpoint is read from `fedat.state.<service>` through the management API,
fetched and requeued in one call. (While the service runs that read would race its saves: RabbitMQ puts a
requeued message back ahead of a newer one and the one-message queue then drops the newer. So a service that has a
pod is only ever asked; if it does not answer, it is reported as not checked, and checks its checkpoint itself
when it starts.)

Exit 0 when every checkpoint fits, or none exists yet; 1 naming every difference; 2 when the broker or a service
gives an answer that cannot be read. Nothing is written, consumed or purged.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import socket
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, urlparse

from fedat.deploy.provision import ManagementApi
from fedat.errors import CheckpointError, ProvisionError
from fedat.protocol import checkpoint, fingerprint, topology
from fedat.runtime.serving import fingerprint_of


def state_versions() -> dict[str, int]:
    """The state version this code's durable services read, by service."""
    from fedat_aggregator.aggregator import Aggregator
    from fedat_aggregator.barrier import Barrier
    from fedat_profiler.profiler import Profiler

    return {cls.name: cls.codec.version for cls in (Barrier, Aggregator, Profiler)}


@dataclass(frozen=True)
class Finding:
    """What the check found for one service: where the fingerprint came from and what differs."""

    service: str
    source: str  # "running process", "checkpoint <seq>", "no checkpoint", or why it was not checked
    differences: tuple[str, ...] = ()


def fetch_running(url: str, timeout: float = 5.0) -> Mapping[str, str] | None:
    """A running service's fingerprint from its /fingerprint endpoint; None if the service has no pod at all.

    No pod: the service's name does not resolve (a headless Service lists every pod, ready or not). A pod that does
    not answer (starting, crashing, or a NetworkPolicy older than this check), or answers without the endpoint
    (code older than fingerprints): CheckpointError, since its checkpoint cannot be read safely while it may run.
    """
    parsed = urlparse(url)
    try:
        socket.getaddrinfo(parsed.hostname, parsed.port or 80)
    except socket.gaierror:
        return None
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            body = json.loads(r.read())
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            raise CheckpointError(f"{url}: the running process serves no /fingerprint (older code)") from None
        raise CheckpointError(f"{url}: HTTP {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, OSError, TimeoutError) as exc:
        reason = getattr(exc, "reason", exc)
        raise CheckpointError(f"{url}: the service has a pod but it does not answer ({reason})") from None
    except ValueError as exc:
        raise CheckpointError(f"{url}: not JSON ({exc})") from None
    if not isinstance(body, dict):
        raise CheckpointError(f"{url}: not a fingerprint: {str(body)[:200]}")
    return {str(k): str(v) for k, v in body.items()}


def read_checkpoint(api: ManagementApi, vhost: str, service: str) -> checkpoint.Checkpoint | None:
    """The service's latest checkpoint, fetched and requeued in one management call; None if there is none."""
    queue = topology.state_queue(service)
    path = f"queues/{quote(vhost, safe='')}/{quote(queue, safe='')}/get"
    answer = api.call("POST", path, {"count": 1, "ackmode": "ack_requeue_true", "encoding": "base64"}, missing_ok=True)
    if not answer:
        return None
    payload = answer[0].get("payload", "")
    data = base64.b64decode(payload) if answer[0].get("payload_encoding") == "base64" else payload.encode()
    return checkpoint.decode(data, service)


def saved_fingerprint(c: checkpoint.Checkpoint) -> dict[str, str]:
    """What a checkpoint is valid for; one saved before fingerprints still names its state version."""
    written = dict(c.fingerprint)
    if fingerprint.STATE_VERSION not in written:
        version = fingerprint.state_version(c.state)
        if version is not None:
            written[fingerprint.STATE_VERSION] = str(version)
    return written


def check(
    env: Mapping[str, str],
    running: Callable[[str], Mapping[str, str] | None],
    stored: Callable[[str], checkpoint.Checkpoint | None],
    versions: Mapping[str, int] | None = None,
) -> list[Finding]:
    """One Finding per durable service: the running process's fingerprint if it answers, else its checkpoint's."""
    versions = state_versions() if versions is None else versions
    out = []
    for service in topology.STATEFUL:
        new = fingerprint_of(versions[service], env)
        try:
            old = running(service)
        except CheckpointError as exc:
            out.append(Finding(service, f"not checked: {exc}; the new process checks its checkpoint when it starts"))
            continue
        if old is not None:
            out.append(Finding(service, "running process", tuple(fingerprint.differences(old, new))))
            continue
        saved = stored(service)
        if saved is None:
            out.append(Finding(service, "no checkpoint"))
        else:
            diffs = fingerprint.differences(saved_fingerprint(saved), new)
            out.append(Finding(service, f"checkpoint {saved.seq}", tuple(diffs)))
    return out


def report(findings: list[Finding], vhost: str) -> tuple[int, str]:
    """The exit status and the text to print: every service's outcome, then what to do about a refusal."""
    lines = []
    for f in findings:
        what = f": {'; '.join(f.differences)}" if f.differences else ""
        lines.append(f"{'REFUSED' if f.differences else 'ok':8s} {f.service}: {f.source}{what}")
    refused = [f for f in findings if f.differences]
    if refused:
        lines.append(
            fingerprint.refusal(
                ", ".join(f.service for f in refused),
                f"vhost {vhost!r}",
                sorted({d for f in refused for d in f.differences}),
            ).replace("Nothing was restored or changed.", "Nothing was changed: the upgrade stops here.")
        )
    return (1 if refused else 0), "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Run the check from the command line or a hook Job; exit 0 (fits), 1 (refused) or 2 (cannot tell)."""
    env = os.environ
    p = argparse.ArgumentParser(prog="python -m fedat.deploy.upgrade_check", description=__doc__.split("\n\n")[0])
    p.add_argument("--api-url", default=env.get("FEDAT_MANAGEMENT_URL", "http://127.0.0.1:15672"))
    p.add_argument("--vhost", default=env.get("FEDAT_VHOST", ""))
    p.add_argument("--admin-user", default=env.get("FEDAT_ADMIN_USER", "guest"))
    p.add_argument("--admin-password-file", default=env.get("FEDAT_ADMIN_PASSWORD_FILE", ""))
    p.add_argument(
        "--service-url",
        default=env.get("FEDAT_SERVICE_URL", ""),
        help="where a running service answers, with {service} for its name, e.g. http://rel-{service}:9101 "
        "(FEDAT_SERVICE_URL; per service FEDAT_<SERVICE>_URL); none: every checkpoint is read from the broker",
    )
    args = p.parse_args(argv)
    if not args.vhost:
        p.error("--vhost (or FEDAT_VHOST) is required")
    if args.admin_password_file:
        password = Path(args.admin_password_file).read_text().strip()
    else:
        password = env.get("FEDAT_ADMIN_PASSWORD", "guest")
    api = ManagementApi(args.api_url, args.admin_user, password)

    def running(service: str) -> Mapping[str, str] | None:
        base = env.get(f"FEDAT_{service.upper()}_URL") or args.service_url.replace("{service}", service)
        return fetch_running(f"{base.rstrip('/')}/fingerprint") if base else None

    try:
        findings = check(env, running, lambda service: read_checkpoint(api, args.vhost, service))
    except (ProvisionError, CheckpointError) as exc:
        print(f"upgrade check: cannot tell whether the run's checkpoints fit: {exc}", file=sys.stderr)
        sys.exit(2)
    status, text = report(findings, args.vhost)
    print(text, flush=True)
    sys.exit(status)


if __name__ == "__main__":
    main()

"""`fedat-client`: one real client, configured by FEDAT_* variables or by its enrollment folder's `client.env`.

    fedat-client --env clients/client-3/client.env [--app my_app:app] [--delay SECONDS]

Variables: FEDAT_CLIENT_ID (required), FEDAT_APP (default the built-in app), FEDAT_AMQP_URL or FEDAT_AMQP_URL_FILE,
FEDAT_KEYRING_FILE (holding this client's own key `client-<k>`), FEDAT_NUM_TIERS, FEDAT_TLS_* for amqps://,
FEDAT_METRICS_PORT (default 9107; 0 = none), FEDAT_TF_THREADS (default 1), FEDAT_STATE_DIR (where the client keeps
its state, the task models it decodes the next task against, across restarts; default `state` beside the `--env`
file if that can be written, none without one; empty = none), and any FEDAT_* variable the app reads.
The `--env` file's variables win over the inherited environment (the file is the client's identity, as enrolled);
the flags win over both. A relative path in a `*_FILE` variable of the file is taken from the file's folder.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import pika

from fedat.errors import AppError, BrokerRefused, CheckpointError, ConfigError, StateError
from fedat.protocol import fingerprint, ids, topology
from fedat.protocol.service import Outgoing
from fedat.protocol.wire import Leave
from fedat.runtime import config
from fedat.runtime.bus import BrokerConfig, publish_once
from fedat.runtime.filestore import FileStore
from fedat.runtime.serving import serve_forever, setup_logging, stop_on_signals
from fedat_worker.app import DEFAULT_APP, Context
from fedat_worker.client import ClientConfig

log = logging.getLogger(__name__)

METRICS_PORT = 9107  # the next port after the services' (system table): a client usually runs alone on its host
LEAVE_PATIENCE = 10.0  # seconds a stopping client tries to say goodbye to an unreachable broker
STATE_DIR = "FEDAT_STATE_DIR"


@dataclass(frozen=True)
class Settings:
    """Everything a client process needs."""

    broker: BrokerConfig
    client: ClientConfig
    context: Context  # what the app is told: this client's id, the seed, the FEDAT_* settings
    threads: int
    metrics_port: int
    state_dir: str | None  # FEDAT_STATE_DIR: where its state is saved across restarts; "" = nowhere, None = unset


def read_env_file(path: str | os.PathLike) -> dict[str, str]:
    """The `NAME=value` lines of an env file (`#` comments and blank lines ignored, no quoting, no expansion); a
    relative path in a `*_FILE` variable is taken from the file's folder (docs/wire-format.md §11.1)."""
    source = Path(path)
    try:
        text = source.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--env {path}: cannot read it ({type(exc).__name__})") from None
    env: dict[str, str] = {}
    for lineno, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, value = line.partition("=")
        name, value = name.strip(), value.strip()
        if not sep or not name.isidentifier():
            raise ConfigError(f"--env {path}:{lineno}: expected NAME=value")
        if name.endswith("_FILE") and value and not Path(value).is_absolute():
            value = str(source.parent / value)
        env[name] = value
    return env


def environment(args: argparse.Namespace, inherited: Mapping[str, str]) -> dict[str, str]:
    """The variables this client runs with: inherited, then the --env file's, then the flags'."""
    env = dict(inherited)
    if args.env:
        env.update(read_env_file(args.env))
    if args.app:
        env["FEDAT_APP"] = args.app
    return env


def settings(env: Mapping[str, str], delay: float = 0.0) -> Settings:
    """Build the settings from the variables; ConfigError names what is missing or wrong."""
    raw = env.get("FEDAT_CLIENT_ID", "").strip()
    if not raw.isdigit():
        raise ConfigError(f"FEDAT_CLIENT_ID={raw!r}: set it to this client's id, an integer >= 0")
    client = int(raw)
    if not delay >= 0:
        raise ConfigError(f"--delay {delay}: must be >= 0 seconds")
    broker = config.broker(env, 1)
    name = f"client-{client}"
    if broker.keyring is not None and not broker.keyring.can_sign(name):
        held = ", ".join(sorted(broker.keyring.names)) or "none"
        raise ConfigError(f"the keyring holds no key for {name} (it holds {held}): it cannot sign its answers")
    app = config.get_str(env, "FEDAT_APP", DEFAULT_APP)
    ctx = Context(
        client=client,
        seed=config.get_int(env, "FEDAT_SEED", 0),
        num_clients=config.get_int(env, "FEDAT_NUM_CLIENTS", 0),
        settings={k: v for k, v in env.items() if k.startswith("FEDAT_")},
    )
    return Settings(
        # Its user may not configure anything: the client's queues exist from its enrollment on.
        broker=replace(broker, declare=False),
        client=ClientConfig(client=client, app=app, delay=delay),
        context=ctx,
        threads=config.get_int(env, "FEDAT_TF_THREADS", 1),
        metrics_port=config.get_int(env, "FEDAT_METRICS_PORT", METRICS_PORT),
        state_dir=env[STATE_DIR].strip() if STATE_DIR in env else None,
    )


def build(s: Settings, stopping):
    """The client service with its own data, model and trainer (imports TensorFlow); AppError if the app misfits."""
    from fedat_worker.app import client_data, load_app
    from fedat_worker.client import Client
    from fedat_worker.models import configure_threads, weight_names
    from fedat_worker.workload import model_and_trainer

    configure_threads(s.threads)
    app = load_app(s.client.app)
    data = client_data(app, s.context)  # only its own: the app loads this client's data and nobody else's
    model, trainer = model_and_trainer(app, replace(s.context, client=-1), data, f"app {s.client.app}", stopping)
    c = s.client
    log.info("client %d: app %s, %d training and %d test samples", c.client, c.app, data.n_train, len(data.y_test))
    return Client(c, data, trainer, weight_names(model), [w.copy() for w in model.get_weights()], time.time)


def state_store(s: Settings, env_file: str | None) -> FileStore | None:
    """Where the client keeps its state: FEDAT_STATE_DIR (ConfigError if it cannot be written), else `state` beside
    its env file if it can be written there (an enrollment folder mounted read-only cannot: then nowhere, said)."""
    if s.state_dir is not None:
        return FileStore(s.state_dir, "client") if s.state_dir else None
    if env_file is None:
        return None
    try:
        return FileStore(Path(env_file).parent / "state", "client")
    except ConfigError as exc:
        log.warning("%s; keeping no state: a restart forgets its task models (set FEDAT_STATE_DIR)", exc)
        return None


def state_fingerprint(s: Settings, state_version: int) -> dict[str, str]:
    """What a client's saved state is valid for: this client of this federation (its broker and vhost), this
    state's shape. A new federation is a new vhost: the versions it numbers are not the last one's."""
    p = pika.URLParameters(s.broker.url)
    federation = f"{p.host}:{p.port}/{p.virtual_host}"
    return {fingerprint.STATE_VERSION: str(state_version), "federation": federation, "client": str(s.client.client)}


def usable_store(store: FileStore, fp: Mapping[str, str], codec) -> FileStore:
    """`store`, or a fresh one in its place if what it holds cannot be read or was written for another federation,
    client or state shape: the old folder is moved aside (said), since a client's state is only its own cache."""
    try:
        saved = store.load()
        if saved is None:
            return store
        diffs = fingerprint.differences(saved.fingerprint, fp)
        if not diffs:
            codec.decode(saved.state, saved.models)
            return store
        why = f"written for another client, federation or version ({'; '.join(diffs)})"
    except (CheckpointError, StateError) as exc:
        why = f"unreadable ({exc})"
    aside = next(
        p for n in range(1, 10_000) if not (p := store.folder.with_name(f"{store.folder.name}.set-aside-{n}")).exists()
    )
    try:
        store.folder.rename(aside)
    except OSError as exc:
        raise ConfigError(f"{store.where}: {why}, and it cannot be moved aside ({exc.strerror})") from None
    log.warning("%s: %s; moved to %s, starting without it", store.where, why, aside)
    return FileStore(store.folder, store.service)


def port_free(port: int) -> bool:
    """Whether this host's `port` can still be bound (several clients on one machine share the default)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # As the metrics server binds: a restarted client finds its port in TIME_WAIT, which is no obstacle.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


def leave(s: Settings, reason: str) -> None:
    """Tell the server this client is going away, so the tiers drop it at once rather than after missed rounds."""
    k = s.client.client
    now = time.time()
    msg = Leave(id=ids.leave(k, int(now * 1000)), client=k, reason=reason, sent_at=now)
    try:
        publish_once(
            s.broker, [Outgoing(topology.RESULTS, topology.from_client(topology.LEAVE_KEY, k), msg)], LEAVE_PATIENCE
        )
        log.info("client %d left (%s)", k, reason)
    except Exception as exc:  # leaving is a courtesy: the profiler evicts a client that stops answering anyway
        log.warning("client %d could not say it leaves (%s: %s)", k, type(exc).__name__, exc)


def parse(argv: list[str] | None) -> argparse.Namespace:
    """The command line."""
    p = argparse.ArgumentParser(prog="fedat-client", description="Run one real FedAT client.")
    p.add_argument("--env", help="the client's env file (client.env of its enrollment folder)")
    p.add_argument("--app", help="the app as package.module:attr (overrides FEDAT_APP)")
    p.add_argument(
        "--delay",
        type=float,
        default=0.0,
        help="seconds added before each answer, to stand in for a slow site in a demonstration on one machine "
        "(default 0: off)",
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    """Run one client until SIGTERM or SIGINT, then say it leaves; a task in training goes back to its queue."""
    args = parse(argv)
    setup_logging("client")
    try:
        s = settings(environment(args, os.environ), args.delay)
        stop = stop_on_signals()
        service = build(s, stop.is_set)
        store = state_store(s, args.env)
        fp = state_fingerprint(s, service.codec.version)
        store = usable_store(store, fp, service.codec) if store is not None else None
    except (ConfigError, AppError, FileNotFoundError) as exc:  # a setting, the app, or this client's data missing
        log.critical("%s", exc)
        raise SystemExit(2) from None
    from fedat_worker.metrics import client_metrics

    metrics = client_metrics()
    port = s.metrics_port
    if port and not port_free(port):
        log.warning(
            "metrics port %d is taken (another client on this host?): serving no metrics; set FEDAT_METRICS_PORT", port
        )
        port = 0
    try:
        serve_forever(
            service,
            s.broker,
            metrics.transport.registry,
            metrics.transport,
            port,
            metrics.observe,
            stop=stop,
            persist=store is not None,
            store=store,
            fingerprint=fp,
        )
    except BrokerRefused as exc:
        # Wrong credentials or a revoked client: reconnecting will not help.
        log.critical("client %d: %s", s.client.client, exc)
        raise SystemExit(3) from None
    if metrics.joins._value.get() > 0:  # a client stopped before it ever joined has nothing to leave
        leave(s, "stopped")


if __name__ == "__main__":
    main()

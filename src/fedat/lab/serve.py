"""`fedat serve`: the server side of a real-client deployment as local processes, for clients that join it.

It runs what `fedat run` runs, with the clients taken out: a fresh vhost with one user per role
(`fedat.deploy.vhost`), the system table's REAL-mode processes (barrier, aggregator, profiler, collector, seed)
started phase by phase (`fedat.deploy.launch`), and the recorder writing `results/<run-id>/events.jsonl`. It
enrolls `clients` clients into `results/<run-id>/clients/client-<k>/` (`fedat.deploy.enroll`), prints the command
that starts each, and keeps the deployment's secret in `results/<run-id>/secret` (mode 0600) so that `fedat enroll`
can add clients while it runs. A progress line every few seconds; Ctrl-C, SIGTERM or the end of `minutes` stop the
processes and delete the vhost, its users and the enrolled clients' users.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import uuid
from dataclasses import replace
from pathlib import Path

from fedat.deploy import enroll as enroll_mod
from fedat.deploy import provision as prov
from fedat.deploy.experiment import Experiment
from fedat.deploy.launch import launch, metrics_ports, process_names
from fedat.deploy.supervisor import Supervisor
from fedat.deploy.vhost import MANAGEMENT_ENV, Vhost
from fedat.lab.progress import tiered_clients
from fedat.lab.recorder import RunState, record_in_thread
from fedat.lab.run import _interrupt
from fedat.lab.utilisation import metrics_text
from fedat.protocol.system import Mode, Phase

PROGRESS_EVERY = 5.0  # seconds between progress lines
# Settings a client's app may read as well as the server's processes; `fedat serve` writes them into client.env.
CLIENT_SETTINGS = ("app", "seed", "num_clients")


def tiered(port: int | None) -> int | None:
    """Clients in some tier, from the profiler's metrics; None while it does not answer."""
    text = metrics_text(port)
    return None if text is None else tiered_clients(text)


def progress(s: RunState, elapsed: float, clients: int | None) -> str:
    """One progress line: version, rounds per tier, clients tiered, latest federated accuracy."""
    with s.lock:
        last = s.evaluations[-1] if s.evaluations else None
        accuracy = f"{last['accuracy']:.3f} (version {last['version']})" if last else "-"
        tiers = "-" if clients is None else str(clients)
        return (
            f"[fedat] {elapsed:6.0f}s  version {s.version:5d}  rounds per tier {list(s.tier_counts)}  "
            f"clients tiered {tiers}  federated accuracy {accuracy}"
        )


def _write_secret(path: Path, secret: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secret.hex() + "\n")


def _client_users(vhost: Vhost) -> list[str]:
    """Every enrolled client's user on this vhost (by `fedat serve` or by `fedat enroll` meanwhile)."""
    api = prov.ManagementApi(*vhost.management)
    prefix = enroll_mod.username(f"{vhost.name}-", 0)[:-1]  # `<vhost>-client-`
    return [u["name"] for u in api.call("GET", "users") or () if u["name"].startswith(prefix)]


def serve(exp: Experiment, results: Path, clients: int = 0, minutes: float | None = None, tag: str = "") -> Path:
    """Run the server side until Ctrl-C, SIGTERM or `minutes`; returns the run's folder."""
    exp = replace(exp, settings={**exp.settings, "clients": Mode.REAL.value})
    run_id = tag or f"{time.strftime('%Y%m%d-%H%M%S')}-{exp.name}-{uuid.uuid4().hex[:4]}"
    out = results / run_id
    out.mkdir(parents=True)
    num_tiers = int(exp.settings.get("num_tiers", 5))
    env = {k: v for k, v in os.environ.items() if k not in MANAGEMENT_ENV}
    env = {**env, **exp.env(), "TF_CPP_MIN_LOG_LEVEL": "2"}
    meta = {"name": exp.name, "clients": "real", "enrolled": clients, "settings": exp.settings}
    (out / "experiment.json").write_text(json.dumps(meta, indent=2))
    vhost = Vhost(None, num_tiers)
    vhost.open()
    _write_secret(out / "secret", vhost.secret)
    sup = Supervisor(env, out / "logs")
    state = RunState(started_at=time.time())
    stop = threading.Event()
    events = open(out / "events.jsonl", "w")  # noqa: SIM115 — closed below
    previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGTERM, signal.SIGINT)}
    recorder = None
    failure = None
    try:
        recorder = record_in_thread(vhost, num_tiers, state, events, stop)
        names = process_names(0, Mode.REAL)
        ports = metrics_ports(names)

        def before(phase: Phase, group: list[str]) -> None:
            if phase is Phase.PROFILE:  # events.jsonl's clock starts with the profiler, as in `fedat run`
                with state.lock:
                    state.started_at = time.time()

        print(f"[fedat] serve {run_id}: starting {', '.join(names)} on vhost {vhost.name} ...", flush=True)
        launch(sup, vhost, names, ports, before)
        (out / "services.json").write_text(json.dumps(sup.table(ports), indent=2))
        _enroll(exp, vhost, out, clients, num_tiers)
        t0 = time.time()
        while minutes is None or time.time() - t0 < minutes * 60:
            time.sleep(PROGRESS_EVERY)
            if sup.exited():
                raise RuntimeError(f"services died: {sup.describe_exits()} (see {out / 'logs'})")
            print(progress(state, time.time() - t0, tiered(ports.get("profiler"))), flush=True)
    except KeyboardInterrupt:
        print("\n[fedat] interrupted: stopping the server side", flush=True)
    except RuntimeError as exc:
        failure = str(exc)
        print(f"[fedat] serve failed: {failure}", flush=True)
    finally:
        sup.close()
        stop.set()
        if recorder is not None:
            recorder.join(timeout=10)
        events.close()
        _delete_clients(vhost)
        vhost.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if failure:
        raise SystemExit(f"fedat serve failed: {failure}")
    print(f"[fedat] events in {out / 'events.jsonl'}", flush=True)
    return out


def _enroll(exp: Experiment, vhost: Vhost, out: Path, clients: int, num_tiers: int) -> None:
    """Enroll clients 0..clients-1 and print how to start each, and how to enroll more."""
    extra = {f"FEDAT_{k.upper()}": str(exp.settings[k]) for k in CLIENT_SETTINGS if k in exp.settings}
    folders = []
    for k in range(clients):
        done = enroll_mod.enroll(
            *vhost.management,
            vhost.name,
            k,
            vhost.secret,
            out / "clients" / f"client-{k}",
            num_tiers=num_tiers,
            amqp_host=os.environ.get("FEDAT_AMQP_HOST"),
            extra=extra,
        )
        folders.append(done.folder)
    print(f"[fedat] the server side is up; start each client in its own shell ({len(folders)} enrolled):", flush=True)
    for folder in folders:
        print(f"    fedat-client --env {folder / enroll_mod.ENV_FILE}", flush=True)
    print(
        f"[fedat] enroll more: fedat enroll K --vhost {vhost.name} --secret-file {out / 'secret'} "
        f"--num-tiers {num_tiers} --out {out / 'clients'}/client-K",
        flush=True,
    )


def _delete_clients(vhost: Vhost) -> None:
    """Delete the enrolled clients' users (the vhost goes with `Vhost.close`); never raises."""
    if vhost.name is None or vhost.management is None:
        return
    try:
        users = _client_users(vhost)
        prov.deprovision(*vhost.management, vhost.name, users)
    except Exception as exc:  # the clean-up goes on: say what is left
        print(f"[fedat] could not delete the clients' users of {vhost.name}: {exc}", flush=True)

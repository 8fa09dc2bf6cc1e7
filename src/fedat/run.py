"""`fedat run`: start every service as a local process on a fresh vhost, follow the run, write results/<run-id>/.

Unless given a broker URL, the run provisions a fresh vhost through the management API (`fedat.provision`): the
topology, and one least-privilege user per role named `<vhost>-<role>`. Each service connects as its role's user
and does not declare the topology (`FEDAT_DECLARE_TOPOLOGY=0`); the vhost and the users are deleted at the end.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from fedat import calibrate as cal
from fedat import config, signing
from fedat import provision as prov
from fedat.bus import BrokerConfig, run_service
from fedat.children import die_with_parent
from fedat.latency import client_profiles
from fedat.metrics import transport_metrics
from fedat.ports import free_ports
from fedat.recorder import Recorder, RunState
from fedat.roles import SERVICE_ROLES

log = logging.getLogger("fedat.run")

SERVICES = {
    "aggregator": "fedat_aggregator.aggregator_main",
    "barrier": "fedat_aggregator.barrier_main",
    "profiler": "fedat_profiler.main",
    "worker": "fedat_worker.worker_main",
    "evaluator": "fedat_worker.evaluator_main",
    "seed": "fedat_worker.seed_main",
}

# Read by `fedat run` only, to provision its vhost; never passed on to a service.
MANAGEMENT_ENV = (
    "FEDAT_MANAGEMENT_URL",
    "FEDAT_ADMIN_USER",
    "FEDAT_ADMIN_PASSWORD",
    "FEDAT_ADMIN_PASSWORD_FILE",
    "FEDAT_AMQP_HOST",
)


@dataclass(frozen=True)
class Experiment:
    """An experiment file: a name, how many worker processes, FEDAT_* settings shared by every service, and whether
    `fedat run` rescales the latency model so that the workers are busy a target share of the time (0: never)."""

    name: str
    workers: int
    minutes: float
    settings: dict[str, Any]
    calibrate: float = 0.0  # `fedat run` only: a comparison or a simulation keeps the file's fixed time scale

    def env(self) -> dict[str, str]:
        """The settings as FEDAT_* environment variables (lists become comma-separated)."""

        def text(v: Any) -> str:
            if isinstance(v, list | tuple):
                return ",".join(text(x) for x in v)
            return str(v)

        return {f"FEDAT_{k.upper()}": text(v) for k, v in self.settings.items()}


# What an experiment may set: every FEDAT_* variable the services read (lower-cased, without the prefix), except
# the ones `fedat run` sets per process. A typo must fail loudly, not run the default silently.
SETTINGS = frozenset(
    """async_alpha batch_size buffer_size classes_per_client clients_per_round codec concurrency data_root dataset
    deadline_factor delays device_factor dirichlet_alpha drift_fraction drop_window epochs eval_anchor eval_every
    eval_interval ewma_alpha group_sizes history learning_rate log_level max_message_bytes max_misses min_clients
    min_deadline model num_clients num_tiers partition precision prefetch profile_concurrency profile_deadline
    profile_epochs prox_lambda retier_every samples_per_client seed server_lr server_lr_decay staleness step_seconds
    straggler_fraction strategy tf_threads tier_balance tier_sizes tifl_credits time_scale unstable_clients""".split()
)


def check_settings(settings: dict[str, Any], where: str) -> dict[str, Any]:
    """The settings unchanged, or ValueError naming every unknown key."""
    unknown = sorted(set(settings) - SETTINGS)
    if unknown:
        raise ValueError(f"{where}: unknown setting(s) {unknown}; known settings: {' '.join(sorted(SETTINGS))}")
    return settings


def load_experiment(path: str | Path) -> Experiment:
    """Read an experiment YAML file; errors name the file and the key."""
    raw = yaml.safe_load(Path(path).read_text())
    if not isinstance(raw, dict) or not isinstance(raw.get("settings"), dict):
        raise ValueError(f"{path}: expected a map with 'name', 'workers', 'minutes' and a 'settings' map")
    check_settings(raw["settings"], str(path))
    target = float(raw.get("calibrate") or 0)
    if not 0 <= target <= 2:
        raise ValueError(f"{path}: calibrate is the workers' target utilisation, within (0, 2] (0: off), got {target}")
    return Experiment(
        name=str(raw.get("name", Path(path).stem)),
        workers=int(raw.get("workers", 2)),
        minutes=float(raw.get("minutes", 10)),
        settings=dict(raw["settings"]),
        calibrate=target,
    )


class Processes:
    """The services of one run, as child processes with their logs in the run folder."""

    def __init__(self, env: dict[str, str], logdir: Path):
        self.env, self.logdir = env, logdir
        self.procs: list[tuple[str, subprocess.Popen, Any]] = []
        logdir.mkdir(parents=True, exist_ok=True)

    def start(self, name: str, module: str, extra: dict[str, str] | None = None) -> subprocess.Popen:
        """Start one service (`extra`: its own variables, e.g. its role's FEDAT_AMQP_URL)."""
        logf = open(self.logdir / f"{name}.log", "ab")  # noqa: SIM115 — closed in stop()
        env = {**self.env, **(extra or {})}
        p = subprocess.Popen(
            [sys.executable, "-m", module], env=env, stdout=logf, stderr=subprocess.STDOUT, preexec_fn=die_with_parent
        )
        self.procs.append((name, p, logf))
        return p

    def table(self, ports: dict[str, int]) -> dict[str, dict]:
        """Name -> pid and metrics port of every process started (for monitoring and benchmarks)."""
        return {n: {"pid": p.pid, "metrics_port": ports.get(n)} for n, p, _ in self.procs}

    def dead(self) -> list[str]:
        """Services that exited although nobody asked them to (the seed job's clean exit is its job done)."""
        return [
            f"{n} (exit {p.returncode})"
            for n, p, _ in self.procs
            if p.poll() is not None and (n != "seed" or p.returncode != 0)
        ]

    def stop(self) -> None:
        """SIGTERM everything, then SIGKILL what is still alive after 10 s."""
        for _, p, _ in self.procs:
            if p.poll() is None:
                p.terminate()
        deadline = time.time() + 10
        for _, p, logf in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            logf.close()


def metrics_ports(names: list[str]) -> dict[str, int]:
    """A free 127.0.0.1 TCP port for each name, outside the ephemeral range (a restarted service gets it back)."""
    return dict(zip(names, free_ports(len(names)), strict=True))


def _interrupt(signum, frame) -> None:
    # One request to stop is enough: a second signal must not abort the clean-up (vhost, children, summary).
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise KeyboardInterrupt


def _connected(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1) as r:
            return b"fedat_broker_connected 1.0" in r.read()
    except OSError:
        return False


def wait_connected(ports: list[int], procs: Processes, timeout: float) -> None:
    """Wait until every listed service reports a broker connection on its metrics endpoint."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if all(_connected(p) for p in ports):
            return
        if procs.dead():
            raise RuntimeError(f"services died during start-up: {procs.dead()} (see their logs)")
        time.sleep(0.5)
    raise RuntimeError(f"services did not connect within {timeout:.0f}s")


class Broker:
    """The broker side of one run: a role's AMQP URL, its signing keys, and whether its services declare the topology.

    Without a URL, `open` provisions a fresh vhost with one user per role (management API); `close` deletes them.
    Every run gets a fresh signing secret; each role's process receives only its own keys (`keys_for_role`), in a
    keyring file in a private temporary folder that `close` removes."""

    def __init__(self, amqp_url: str | None, num_tiers: int):
        self.given = amqp_url
        self.num_tiers = num_tiers
        self.vhost: str | None = None
        self.urls: dict[str, str] = {}
        self.management: tuple[str, str, str] | None = None
        self.secret = secrets.token_bytes(32)
        self.keys_dir: str | None = None

    def keyring_file(self, role: str) -> str:
        """The file holding `role`'s keys (written on first use, mode 0600)."""
        if self.keys_dir is None:
            self.keys_dir = tempfile.mkdtemp(prefix="fedat-keys-")
        path = Path(self.keys_dir) / f"{role}.json"
        if not path.exists():
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                json.dump(signing.keys_for_role(self.secret, role), f)
        return str(path)

    def keyring(self, role: str) -> signing.Keyring:
        """`role`'s keys, for a service run inside this process (the recorder)."""
        return signing.Keyring.from_mapping(signing.keys_for_role(self.secret, role))

    def open(self) -> None:
        """Provision the vhost and the users (unless a URL was given); on failure, remove what was made."""
        if self.given is not None:
            return
        self.management = _management(os.environ)
        self.vhost = f"fedat-run-{uuid.uuid4().hex[:8]}"
        users = {role: (f"{self.vhost}-{role}", secrets.token_urlsafe(24)) for role in SERVICE_ROLES}
        try:
            host = os.environ.get("FEDAT_AMQP_HOST")  # default: the management API's host, port 5672
            self.urls = prov.provision(*self.management, self.vhost, self.num_tiers, users, amqp_host=host)
        except BaseException:
            self.close()
            raise

    @property
    def declare(self) -> bool:
        """Services declare the topology only on a broker URL given by the caller (as before provisioning)."""
        return self.given is not None

    def url(self, role: str) -> str:
        """The AMQP URL `role`'s services connect with."""
        return self.given if self.given is not None else self.urls[role]

    def env(self, role: str) -> dict[str, str]:
        """The variables that tell a service of `role` where and how to connect, and with which keys to sign."""
        return {
            "FEDAT_AMQP_URL": self.url(role),
            "FEDAT_DECLARE_TOPOLOGY": "1" if self.declare else "0",
            "FEDAT_KEYRING_FILE": self.keyring_file(role),
        }

    def close(self) -> None:
        """Delete the keys, the provisioned vhost and users (nothing if a URL was given); never raises."""
        if self.keys_dir is not None:
            shutil.rmtree(self.keys_dir, ignore_errors=True)
            self.keys_dir = None
        if self.vhost is None or self.management is None:
            return
        names = [f"{self.vhost}-{role}" for role in SERVICE_ROLES]
        try:
            prov.deprovision(*self.management, self.vhost, names)
        except Exception as exc:  # the run's results matter more than the clean-up: say what is left
            print(f"[fedat] could not delete vhost {self.vhost} and its users {names}: {exc}", flush=True)
        self.vhost = None


def _management(env: Mapping[str, str]) -> tuple[str, str, str]:
    """(API URL, admin user, admin password) from FEDAT_MANAGEMENT_URL, FEDAT_ADMIN_USER, FEDAT_ADMIN_PASSWORD(_FILE);
    the local broker's guest by default."""
    pw_file = env.get("FEDAT_ADMIN_PASSWORD_FILE")
    password = Path(pw_file).read_text().strip() if pw_file else env.get("FEDAT_ADMIN_PASSWORD", "guest")
    return env.get("FEDAT_MANAGEMENT_URL", prov.DEFAULT_API_URL), env.get("FEDAT_ADMIN_USER", "guest"), password


PROBE_SECONDS = 4.0  # measured per probe after tracing: a few client tasks, against a 10-minute run
SIMULATED_REFINEMENTS = 2  # virtual-time corrections of the closed-form guess (each a few seconds, no TensorFlow)


def probe_machine(env: dict[str, str], workers: int, seconds: float = PROBE_SECONDS) -> dict:
    """Seconds per training step here: one `fedat_worker.probe` per worker process, all measuring at once."""
    cmd = [sys.executable, "-m", "fedat_worker.probe", "--seconds", str(seconds)]
    probes = [
        subprocess.Popen(
            cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, preexec_fn=die_with_parent
        )
        for _ in range(workers)
    ]
    try:
        for p in probes:  # each traces first: the measurements start together, the cores loaded as in the run
            if p.stdout.readline().strip() != "ready":
                raise RuntimeError(f"the trainer probe failed (exit {p.wait()})")
        for p in probes:
            p.stdin.write("go\n")
            p.stdin.flush()
        results = [json.loads(p.stdout.readline()) for p in probes]
    finally:
        for p in probes:
            if p.poll() is None:
                p.kill()
            p.wait()
    return {
        # CPU seconds, not wall: what a step costs a core of this machine, whoever else shares it during the probe.
        "cpu_step_seconds": sum(r["cpu_step_seconds"] for r in results) / len(results),
        "wall_step_seconds": sum(r["step_seconds"] for r in results) / len(results),
        "probes": [{k: v for k, v in r.items() if k != "train_samples"} for r in results],
        "train_samples": results[0]["train_samples"],
    }


def simulated_demand(exp: Experiment, train_samples: list[int], step_cost: float) -> dict:
    """Steps the services release in `exp.minutes` of virtual time (`fedat_sim.demand`, its own process)."""
    request = {
        "experiment": {"name": exp.name, "workers": exp.workers, "minutes": exp.minutes, "settings": exp.settings},
        "train_samples": train_samples,
        "measured_step_seconds": step_cost,
    }
    r = subprocess.run(
        [sys.executable, "-m", "fedat_sim.demand"], input=json.dumps(request), capture_output=True, text=True
    )
    if r.returncode != 0:
        raise RuntimeError(f"the demand simulation failed: {r.stderr.strip()[-2000:]}")
    return json.loads(r.stdout)


def calibrate_experiment(exp: Experiment, env: dict[str, str]) -> tuple[Experiment, dict]:
    """`exp` with the time scale at which its workers are busy `exp.calibrate` of the time here; how it was found."""
    if str(exp.settings.get("strategy", "fedat")) not in cal.TIER_LOOPS:
        raise ValueError(f"calibrate models tier loops ({sorted(cal.TIER_LOOPS)}), not {exp.settings['strategy']!r}")
    print(f"[fedat] calibrating: {exp.workers} trainer probes ...", flush=True)
    probe = probe_machine(env, exp.workers)
    cost = probe["cpu_step_seconds"]
    sizes = probe.pop("train_samples")
    capacity = cal.worker_capacity(exp.workers, os.cpu_count() or 1)
    profile = config.latency(exp.env())
    seed = int(exp.settings.get("seed", 0))
    batch, epochs = int(exp.settings.get("batch_size", 10)), int(exp.settings.get("epochs", 3))
    guess = cal.calibrate(
        client_profiles(len(sizes), profile, seed),
        [epochs * -(-n // batch) for n in sizes],
        cost,
        step_seconds=profile.step_seconds,
        time_scale=profile.time_scale,
        capacity=capacity,
        num_tiers=int(exp.settings.get("num_tiers", 5)),
        clients_per_round=int(exp.settings.get("clients_per_round", 10)),
        target=exp.calibrate,
        tier_sizes=tuple(float(x) for x in exp.settings.get("tier_sizes", ()) or ()),
    )
    time_scale, simulated = guess.time_scale, []
    for _ in range(SIMULATED_REFINEMENTS):
        trial = replace(exp, settings={**exp.settings, "time_scale": time_scale})
        d = simulated_demand(trial, sizes, cost)
        used = cal.utilisation(d["steps"], d["window_seconds"], cost, capacity)
        simulated.append({"time_scale": time_scale, "utilisation": round(used, 4), **d})
        if used <= 0 or abs(used / exp.calibrate - 1) < 0.03:
            break
        time_scale = cal.rescale(time_scale, used, exp.calibrate)
    record = {
        "target": exp.calibrate,
        "workers": exp.workers,
        "capacity_cores": capacity,
        "step_cost_seconds": cost,
        "probe": probe,
        "reference_time_scale": profile.time_scale,
        "time_scale": time_scale,
        "factor": time_scale / profile.time_scale,
        "step_seconds": profile.step_seconds,  # unchanged: every latency is scaled by `factor` through the time scale
        "closed_form": {
            "time_scale": guess.time_scale,
            "reference_utilisation": round(guess.reference_utilisation, 4),
            "round_seconds": [round(t, 2) for t in guess.round_seconds],
        },
        "simulated": simulated,
    }
    print(
        f"[fedat] calibrated: {cost * 1e3:.2f} ms of CPU per step (wall {probe['wall_step_seconds'] * 1e3:.2f} ms); "
        f"time_scale {profile.time_scale:g} -> {time_scale:.4g} for {exp.calibrate:.0%} busy workers",
        flush=True,
    )
    return replace(exp, settings={**exp.settings, "time_scale": round(time_scale, 6)}), record


def proc_cpu_seconds(stat: str, ticks: int) -> float:
    """User + system CPU seconds from the text of /proc/<pid>/stat (fields 14 and 15, after the command's ')')."""
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / ticks


def _cpu_seconds(pid: int) -> float | None:
    try:
        return proc_cpu_seconds(Path(f"/proc/{pid}/stat").read_text(), os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError):
        return None


def train_seconds_total(metrics_text: str) -> float:
    """Sum over tiers of a worker's `fedat_client_train_seconds_sum` (wall seconds inside the trainer)."""
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics_text.splitlines()
        if line.startswith("fedat_client_train_seconds_sum")
    )


def _train_seconds(port: int | None) -> float | None:
    if not port:
        return None
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            return train_seconds_total(r.read().decode())
    except (OSError, ValueError):
        return None


@dataclass(frozen=True)
class Sample:
    """Each worker's CPU seconds and training seconds at one instant."""

    at: float
    cpu: dict[str, float | None]
    train: dict[str, float | None]


def sample_workers(procs: Processes, ports: dict[str, int]) -> Sample:
    """CPU seconds (/proc) and wall seconds spent training (its metrics) of every worker process, now."""
    workers = [(n, p) for n, p, _ in procs.procs if n.startswith("worker-")]
    return Sample(
        time.time(),
        {n: _cpu_seconds(p.pid) for n, p in workers},
        {n: _train_seconds(ports.get(n)) for n, _ in workers},
    )


def worker_utilisation(start: Sample, end: Sample) -> dict:
    """CPU seconds per wall second of each worker between two samples, and the share of it spent training."""
    wall = end.at - start.at

    def rate(a: float | None, b: float | None) -> float | None:
        return round((b - a) / wall, 4) if a is not None and b is not None and wall > 0 else None

    cpu = {n: rate(start.cpu.get(n), end.cpu.get(n)) for n in end.cpu}
    train = {n: rate(start.train.get(n), end.train.get(n)) for n in end.train}

    def mean(xs: dict) -> float | None:
        vals = [v for v in xs.values() if v is not None]
        return round(sum(vals) / len(vals), 4) if vals else None

    return {
        "mean": mean(cpu),
        "per_worker": cpu,
        "training_mean": mean(train),
        "training_per_worker": train,
        "window_seconds": round(wall, 1),
        "window": "first global update to the end of the run",
    }


def run(
    exp: Experiment,
    results: Path,
    minutes: float | None = None,
    amqp_url: str | None = None,
    tag: str = "",
    prometheus: bool = False,
) -> dict:
    """Run one experiment end to end and return its summary (`prometheus`: observe it, see `fedat.observe`)."""
    run_id = tag or f"{time.strftime('%Y%m%d-%H%M%S')}-{exp.name}-{uuid.uuid4().hex[:4]}"
    out = results / run_id
    out.mkdir(parents=True)
    num_tiers = int(exp.settings.get("num_tiers", 5))
    minutes = exp.minutes if minutes is None else minutes
    base_env = {k: v for k, v in os.environ.items() if k not in MANAGEMENT_ENV}
    calibration = None
    if exp.calibrate:  # before the vhost exists: a failed probe leaves nothing behind on the broker
        exp, calibration = calibrate_experiment(
            replace(exp, minutes=minutes), {**base_env, **exp.env(), "TF_CPP_MIN_LOG_LEVEL": "2"}
        )
    broker = Broker(amqp_url, num_tiers)
    broker.open()
    started = time.time()
    env = {**base_env, **exp.env(), "TF_CPP_MIN_LOG_LEVEL": "2"}
    meta = {"name": exp.name, "workers": exp.workers, "minutes": minutes, "settings": exp.settings}
    (out / "experiment.json").write_text(json.dumps({**meta, "calibration": calibration}, indent=2))
    procs = Processes(env, out / "logs")
    state = RunState(started_at=started)
    stop = threading.Event()
    events = open(out / "events.jsonl", "w")  # noqa: SIM115 — closed below
    recorder_broker = BrokerConfig(
        url=broker.url("recorder"),
        num_tiers=num_tiers,
        prefetch=16,
        declare=broker.declare,
        keyring=broker.keyring("recorder"),
    )
    recorder = threading.Thread(
        target=run_service,
        args=(Recorder(state, events), recorder_broker, transport_metrics(_registry(), "recorder"), stop),
        daemon=True,
    )
    failure = None
    window_start = window_end = None  # the workers' CPU and training seconds, for their utilisation
    observer = None  # a local Prometheus (--prometheus)
    # Stop like Ctrl-C: services stopped, vhost and users deleted, summary written.
    interrupted = False
    previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        # Free ports, not fixed ones: two runs (or a run and a benchmark) on one machine must not collide.
        ports = metrics_ports(
            [*(f"worker-{i}" for i in range(exp.workers)), "evaluator", "aggregator", "barrier", "profiler"]
        )
        if prometheus:
            from fedat import observe

            observer = observe.start(out, ports, broker)
        recorder.start()
        # The seed job starts first: its cold TensorFlow start (~10 s) then overlaps the services' start-up instead of
        # delaying the first round past the end of a short profiling pass.
        procs.start("seed", SERVICES["seed"], {**broker.env("seed"), "FEDAT_METRICS_PORT": "0"})
        for name, port in ports.items():
            if name != "profiler":
                role = name.split("-")[0]
                procs.start(name, SERVICES[role], {**broker.env(role), "FEDAT_METRICS_PORT": str(port)})
        print(f"[fedat] run {run_id}: starting {exp.workers} workers, evaluator, aggregator, barrier ...", flush=True)
        wait_connected([p for n, p in ports.items() if n != "profiler"], procs, timeout=180)
        with state.lock:  # the clock of events.jsonl starts with the profiling pass, not with process start-up
            state.started_at = time.time()
        # Profiling starts only now, so that worker start-up does not count as client latency.
        procs.start(
            "profiler", SERVICES["profiler"], {**broker.env("profiler"), "FEDAT_METRICS_PORT": str(ports["profiler"])}
        )
        (out / "services.json").write_text(json.dumps(procs.table(ports), indent=2))
        t0 = time.time()
        print(f"[fedat] running for {minutes:g} min; results in {out}", flush=True)
        while time.time() - t0 < minutes * 60:
            time.sleep(5)
            if procs.dead():
                raise RuntimeError(f"services died: {procs.dead()} (see {out / 'logs'})")
            if window_start is None and state.version >= 1:  # profiled, tiers assigned, a first round merged
                window_start = sample_workers(procs, ports)
            print(_progress(state, time.time() - t0), flush=True)
    except KeyboardInterrupt:
        interrupted = True
        print("\n[fedat] interrupted: stopping services", flush=True)
    except RuntimeError as exc:
        failure = str(exc)
        print(f"[fedat] run failed: {failure}", flush=True)
    finally:
        if window_start is not None:
            window_end = sample_workers(procs, ports)
        if observer is not None:
            observer.stop()
        procs.stop()
        stop.set()
        recorder.join(timeout=10)
        events.close()
        broker.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    summary = summarize(exp, state, time.time() - started)
    summary["failure"] = failure
    summary["run_dir"] = str(out)
    summary["calibration"] = calibration
    summary["worker_utilisation"] = worker_utilisation(window_start, window_end) if window_end else None
    summary["load_average"] = [round(x, 2) for x in os.getloadavg()]  # others' work on the machine lowers the above
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    try:
        from fedat.plots import plot_run

        plot_run(out)
    except ImportError:
        print("[fedat] matplotlib missing: no plots", flush=True)
    print(json.dumps(summary, indent=2))
    if summary["worker_utilisation"]:
        u = summary["worker_utilisation"]
        print(
            f"[fedat] workers busy (CPU s per s, {u['window_seconds']:.0f} s after the first global update): "
            f"mean {u['mean']}, per worker {u['per_worker']}; training {u['training_mean']}; "
            f"load average {summary['load_average']}",
            flush=True,
        )
    if interrupted:
        raise KeyboardInterrupt  # after the clean-up and the summary: callers such as `fedat compare` stop too
    if failure:
        raise SystemExit(f"fedat run failed: {failure}")
    return summary


def _registry():
    from prometheus_client import CollectorRegistry

    return CollectorRegistry()


def _progress(s: RunState, elapsed: float) -> str:
    with s.lock:
        acc = s.evaluations[-1]["accuracy"] if s.evaluations else float("nan")
        return (
            f"[fedat] {elapsed:6.0f}s  version {s.version:5d}  rounds per tier {list(s.tier_counts)}  "
            f"accuracy {acc:.3f}  late {s.late}/{s.updates}"
        )


def summarize(exp: Experiment, s: RunState, wall: float) -> dict:
    """The run's headline numbers."""
    evals = s.evaluations
    best = max(evals, key=lambda e: e["accuracy"]) if evals else None
    return {
        "method": exp.settings.get("strategy", "fedat"),
        "experiment": exp.name,
        "best_accuracy": best["accuracy"] if best else None,
        "best_version": best["version"] if best else None,
        "final_accuracy": evals[-1]["accuracy"] if evals else None,
        "accuracy_variance": evals[-1]["variance"] if evals else None,
        "best_accuracy_variance": best["variance"] if best else None,
        "global_updates": s.version,
        "tier_rounds": list(s.tier_counts),
        "bytes_up": s.bytes_up,
        "bytes_down": s.bytes_down,
        "client_updates": s.updates,
        "late_updates": s.late,
        "late_fraction": (s.late / s.updates) if s.updates else 0.0,
        "wall_seconds": round(wall, 1),
        "evaluations": len(evals),
        "latency_model": {
            k: exp.settings.get(k)
            for k in (
                "time_scale",
                "device_factor",
                "delays",
                "step_seconds",
                "group_sizes",
                "tier_sizes",
                "straggler_fraction",
                "unstable_clients",
            )
        },
    }

"""`fedat run --prometheus`: a real local Prometheus that scrapes every service of the run and the broker.

It runs the Debian `prometheus` binary (2.42) as a child process on a free port of 127.0.0.1, with a generated
config: every service's metrics port (the free ports `fedat run` assigns and writes to `services.json`), and the
broker's `rabbitmq_prometheus` endpoint (`/metrics/detailed`, per-queue depth and consumers of the run's vhost
only), every 2 s; it loads
`infra/prometheus/alerts.yaml` as rule file. At the end of the run it writes `<run>/prometheus/alerts.json` (the
alerts that fired during the run) and its config (`prometheus.yml`), stops the server by its PID, and keeps the
TSDB under `<run>/prometheus/data` only when it is small (`KEEP_DATA_BYTES`, ~0.3 MB for the 1.5-minute smoke run);
otherwise it is deleted with the server's temporary folder.

Job names follow the convention the alert rules and the dashboard rely on: `fedat-<service>` for FedAT services,
`rabbitmq` for the broker.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from fedat.deploy.children import die_with_parent
from fedat.deploy.ports import free_port
from fedat.deploy.vhost import Vhost

ROOT = Path(__file__).resolve().parents[3]  # src/fedat/ops/observe.py -> the repository
RULES = ROOT / "infra" / "prometheus" / "alerts.yaml"
BINARY = "prometheus"
SCRAPE_INTERVAL = "2s"
BROKER_METRICS = "127.0.0.1:15692"  # host:port of the local broker's rabbitmq_prometheus endpoint
BROKER_FAMILIES = ("queue_coarse_metrics", "queue_consumer_count")
KEEP_DATA_BYTES = 20 * 1024 * 1024
READY_SECONDS = 30.0


def local_targets(ports: Mapping[str, int]) -> dict[str, list[str]]:
    """Job -> targets of a local `fedat run` from its service -> metrics port map (`worker-<i>` are one job)."""
    jobs: dict[str, list[str]] = {}
    for name, port in ports.items():
        jobs.setdefault(f"fedat-{name.split('-')[0]}", []).append(f"127.0.0.1:{port}")
    return jobs


def vhost_of(vhost: Vhost | None) -> str | None:
    """The vhost of a deployment: the one it provisioned, or the one in the URL it was given."""
    if vhost is None:
        return None
    if vhost.name:
        return vhost.name
    if not vhost.given:
        return None
    path = urllib.parse.urlparse(vhost.given).path
    return urllib.parse.unquote(path[1:]) if len(path) > 1 else "/"


def config(
    jobs: dict[str, list[str]], vhost: str | None, rule_files: list[str], broker_target: str | None = None
) -> dict:
    """The Prometheus configuration (as a dict, written as YAML)."""
    scrape = [{"job_name": job, "static_configs": [{"targets": targets}]} for job, targets in jobs.items()]
    params: dict[str, list[str]] = {"family": list(BROKER_FAMILIES)}
    if vhost:
        params["vhost"] = [vhost]
    scrape.append(
        {
            "job_name": "rabbitmq",
            "metrics_path": "/metrics/detailed",
            "params": params,
            "static_configs": [{"targets": [broker_target or BROKER_METRICS]}],
        }
    )
    return {
        "global": {"scrape_interval": SCRAPE_INTERVAL, "evaluation_interval": SCRAPE_INTERVAL, "scrape_timeout": "2s"},
        "rule_files": rule_files,
        "scrape_configs": scrape,
    }


@dataclass
class Observer:
    """One Prometheus server, its temporary storage, and where to leave its results."""

    out: Path
    proc: subprocess.Popen
    url: str
    storage: Path
    started: float = field(default_factory=time.time)

    def query(self, expr: str, timeout: float = 5.0) -> dict:
        """The JSON answer of /api/v1/query for `expr` (evaluated now)."""
        q = urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(f"{self.url}/api/v1/query?{q}", timeout=timeout) as r:
            return json.load(r)

    def fired(self) -> list[dict]:
        """The alerts that were firing at any moment since the start (labels and for how many seconds)."""
        window = max(10, int(time.time() - self.started) + 10)
        answer = self.query(f'count_over_time(ALERTS{{alertstate="firing"}}[{window}s])')
        step = _seconds(SCRAPE_INTERVAL)
        return [
            {"labels": r["metric"], "firing_seconds": round(float(r["value"][1]) * step, 1)}
            for r in answer.get("data", {}).get("result", [])
        ]

    def stop(self, keep: bool = True) -> None:
        """Write alerts.json, stop the server (SIGTERM, SIGKILL after 10 s), keep or delete its data. Never raises.

        `keep=False`: only stop it and delete its data (a server that never got ready)."""
        folder = self.out / "prometheus"
        try:
            if keep and self.proc.poll() is None:
                folder.mkdir(parents=True, exist_ok=True)
                fired = self.fired()
                (folder / "alerts.json").write_text(json.dumps(fired, indent=2))
                names = sorted({a["labels"].get("alertname", "?") for a in fired})
                print(f"[fedat] prometheus: alerts fired during the run: {', '.join(names) or 'none'}", flush=True)
        except (OSError, ValueError) as exc:
            print(f"[fedat] prometheus: could not read the alerts: {exc}", flush=True)
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        try:
            if not keep:
                return
            folder.mkdir(parents=True, exist_ok=True)
            shutil.copy(self.storage / "prometheus.yml", folder / "prometheus.yml")
            tsdb = self.storage / "tsdb"
            size = sum(f.stat().st_size for f in tsdb.rglob("*") if f.is_file())
            if size <= KEEP_DATA_BYTES:
                shutil.move(str(tsdb), str(folder / "data"))
                print(f"[fedat] prometheus stopped; its data ({size / 1e6:.1f} MB) is in {folder / 'data'}", flush=True)
            else:
                print(f"[fedat] prometheus stopped; its data ({size / 1e6:.0f} MB) was too large to keep", flush=True)
        except OSError as exc:
            print(f"[fedat] prometheus stopped; its data could not be kept: {exc}", flush=True)
        finally:
            shutil.rmtree(self.storage, ignore_errors=True)


def _seconds(duration: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    for unit in ("ms", "s", "m", "h"):
        if duration.endswith(unit):
            return float(duration[: -len(unit)]) * units[unit]
    return float(duration)


def start(out: Path, ports: Mapping[str, int], vhost: Vhost | None = None, rules: Path = RULES) -> Observer:
    """Start Prometheus for a local run (service -> metrics port) whose results go to `out`; RuntimeError if not."""
    binary = shutil.which(BINARY)
    if binary is None:
        raise RuntimeError("--prometheus needs the `prometheus` binary (Debian: apt-get install -y prometheus)")
    storage = Path(tempfile.mkdtemp(prefix="fedat-prometheus-"))
    cfg_file = storage / "prometheus.yml"
    cfg_file.write_text(yaml.safe_dump(config(local_targets(ports), vhost_of(vhost), [str(rules)])))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    (out / "logs").mkdir(parents=True, exist_ok=True)
    log = open(out / "logs" / "prometheus.log", "ab")  # noqa: SIM115 — the child holds it; closed when we return
    try:
        proc = subprocess.Popen(
            [
                binary,
                f"--config.file={cfg_file}",
                f"--storage.tsdb.path={storage / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--storage.tsdb.retention.time=1d",
                "--log.level=warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=die_with_parent,
            start_new_session=True,  # Ctrl-C on the run must not stop it before the alerts are read
        )
    finally:
        log.close()
    observer = Observer(out, proc, url, storage)
    try:
        _wait_ready(proc, url, out)
    except BaseException:  # not ready, or Ctrl-C while waiting: leave no server behind
        observer.stop(keep=False)
        raise
    print(f"[fedat] prometheus: {url} (rules: {rules})", flush=True)
    return observer


def _wait_ready(proc: subprocess.Popen, url: str, out: Path) -> None:
    deadline = time.time() + READY_SECONDS
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"prometheus exited with {proc.returncode} (see {out / 'logs' / 'prometheus.log'})")
        try:
            with urllib.request.urlopen(f"{url}/-/ready", timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"prometheus did not get ready within {READY_SECONDS:.0f}s")

"""The services of one local deployment as child processes: start, kill, restart, watch, stop.

Used by every local launcher (`fedat run`, the chaos tool): each process runs `python -m <module>` from the system
table, with the deployment's environment plus its own variables, its output appended to `<logdir>/<name>.log`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from fedat.deploy.children import die_with_parent
from fedat.protocol.system import Kind, service


def reports_connected(port: int) -> bool:
    """The service on metrics port `port` reports `fedat_broker_connected 1`."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1) as r:
            return b"fedat_broker_connected 1.0" in r.read()
    except OSError:
        return False


@dataclass
class Proc:
    """One managed process: restarted with the same environment (its own variables include its metrics port)."""

    name: str
    module: str
    env: dict[str, str]
    popen: subprocess.Popen | None = None
    log: IO[bytes] | None = None
    stopped: bool = False  # we stopped or killed it on purpose (and have not started it again)
    starts: int = 0
    job: bool = field(init=False)

    def __post_init__(self) -> None:
        self.job = service(self.name).kind is Kind.JOB

    def exited(self) -> bool:
        """It is not running although nobody stopped it (a job's clean exit is its work done, not an exit)."""
        if self.stopped or self.popen is None or self.popen.poll() is None:
            return False
        return not (self.job and self.popen.returncode == 0)


class Supervisor:
    """Child processes of one deployment; logs in `<logdir>/<name>.log` (appended across restarts)."""

    def __init__(self, env: dict[str, str], logdir: Path, banner: Callable[[Proc], str] | None = None):
        self.env, self.logdir, self.banner = env, logdir, banner
        self.procs: dict[str, Proc] = {}
        logdir.mkdir(parents=True, exist_ok=True)

    def start(self, name: str, env: dict[str, str] | None = None) -> subprocess.Popen:
        """Start (or start again) the process `name` (`worker-3` runs the worker's module) with its own variables."""
        p = self.procs.setdefault(name, Proc(name, service(name).module, dict(env or {})))
        if p.log is None:
            p.log = open(self.logdir / f"{name}.log", "ab")  # noqa: SIM115 — closed in close()
        if self.banner is not None:
            p.log.write(self.banner(p).encode())
            p.log.flush()
        p.popen = subprocess.Popen(
            [sys.executable, "-m", p.module],
            env={**self.env, **p.env},
            stdout=p.log,
            stderr=subprocess.STDOUT,
            preexec_fn=die_with_parent,
        )
        p.stopped, p.starts = False, p.starts + 1
        return p.popen

    def kill(self, name: str) -> None:
        """SIGKILL a process (it is then down on purpose, not a crash)."""
        p = self.procs[name]
        p.stopped = True
        if p.popen is not None and p.popen.poll() is None:
            os.kill(p.popen.pid, signal.SIGKILL)
            p.popen.wait(timeout=30)

    def restart(self, name: str) -> None:
        """Start a killed process again with its environment (nothing if it is running: two kills, one life)."""
        p = self.procs[name]
        if p.popen is not None and p.popen.poll() is None:
            p.stopped = False
            return
        self.start(name)

    def exited(self) -> list[Proc]:
        """Processes that exited although nobody stopped them."""
        return [p for p in self.procs.values() if p.exited()]

    def describe_exits(self) -> list[str]:
        """`name (exit code)` of every process that exited on its own."""
        return [f"{p.name} (exit {p.popen.returncode})" for p in self.exited() if p.popen is not None]

    def wait_until(self, ready: Callable[[], bool], timeout: float, what: str) -> None:
        """Wait for `ready()`; RuntimeError if a process exits meanwhile or `timeout` seconds pass."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            if ready():
                return
            if self.exited():
                raise RuntimeError(
                    f"services died while waiting for {what}: {self.describe_exits()} (see {self.logdir})"
                )
            time.sleep(0.5)
        raise RuntimeError(f"timed out after {timeout:.0f}s waiting for {what} (see {self.logdir})")

    def table(self, ports: dict[str, int]) -> dict[str, dict[str, Any]]:
        """Name -> pid and metrics port of every process (for monitoring and benchmarks)."""
        return {
            n: {"pid": p.popen.pid if p.popen else None, "metrics_port": ports.get(n)} for n, p in self.procs.items()
        }

    def pids(self, prefix: str = "") -> dict[str, int]:
        """Name -> pid of the running processes whose name starts with `prefix`."""
        return {n: p.popen.pid for n, p in self.procs.items() if n.startswith(prefix) and p.popen is not None}

    def stop(self, names: list[str] | None = None, timeout: float = 10.0) -> None:
        """SIGTERM the named processes (default: all), SIGKILL what is still alive after `timeout`."""
        chosen = [self.procs[n] for n in (names if names is not None else list(self.procs))]
        for p in chosen:
            p.stopped = True
            if p.popen is not None and p.popen.poll() is None:
                p.popen.terminate()
        deadline = time.time() + timeout
        for p in chosen:
            if p.popen is None:
                continue
            try:
                p.popen.wait(timeout=max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                p.popen.kill()
                p.popen.wait(timeout=30)

    def close(self) -> None:
        """Stop everything and close the logs."""
        self.stop()
        for p in self.procs.values():
            if p.log is not None:
                p.log.close()
                p.log = None

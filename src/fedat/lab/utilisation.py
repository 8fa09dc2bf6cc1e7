"""How busy the workers of a local run were: CPU seconds (from /proc) and seconds spent training (their metrics);
and the metrics text any local process serves, which the progress line also reads."""

from __future__ import annotations

import os
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path


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


def metrics_text(port: int | None) -> str | None:
    """The Prometheus text a local process serves on `port`, or None (no port, not up yet, gone)."""
    if not port:
        return None
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            return r.read().decode()
    except (OSError, ValueError):
        return None


def _train_seconds(port: int | None) -> float | None:
    text = metrics_text(port)
    try:
        return None if text is None else train_seconds_total(text)
    except ValueError:
        return None


@dataclass(frozen=True)
class Sample:
    """Each worker's CPU seconds and training seconds at one instant."""

    at: float
    cpu: dict[str, float | None]
    train: dict[str, float | None]


def sample_workers(pids: dict[str, int], ports: dict[str, int]) -> Sample:
    """CPU seconds (/proc) and wall seconds spent training (its metrics) of these worker processes, now."""
    return Sample(
        time.time(),
        {n: _cpu_seconds(pid) for n, pid in pids.items()},
        {n: _train_seconds(ports.get(n)) for n in pids},
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

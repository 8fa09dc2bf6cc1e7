"""The whole example in one shell, for a quick look: the server side, N real clients (the last few slow), a summary.

    python -m fedat_digits.demo --clients 6 --slow 2 --delay 3 --minutes 3      # what `make example-digits` runs

It does what the README does in separate shells: `fedat serve` (which enrolls the clients), each client's own shard
written into its own enrollment folder, one `fedat-client` process per client (the slow ones with `--delay`, which
stands in for a slow site: on one machine every client is equally fast). At the end it prints, per client, the tier
its tasks came from, and the rounds per tier and the federated accuracy from the run's events.jsonl.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from fedat_digits import shards

EXPERIMENT = Path(__file__).resolve().parents[1] / "experiment.yaml"
METRICS_BASE = 9300  # client k serves its metrics on METRICS_BASE + k, so that the demo can read its tiers


def relay(proc: subprocess.Popen, found: dict[str, str], ready: threading.Event) -> None:
    """Print `fedat serve`'s lines as they come and note the run's id."""
    for line in proc.stdout:
        print(line, end="", flush=True)
        m = re.search(r"serve (\S+): starting", line)
        if m:
            found["run"] = m.group(1)
        if "start each client" in line:
            ready.set()
    ready.set()


def tiers_of(port: int) -> dict[int, int]:
    """tier -> tasks a client trained there (tier 0: profiling), from its metrics; {} if it does not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            text = r.read().decode()
    except OSError:
        return {}
    found = re.findall(r'^fedat_client_trainings_total\{tier="(\d+)"\} ([0-9.e+]+)$', text, re.M)
    return {int(t): int(float(n)) for t, n in found}


def summary(run: Path, clients: int, slow: set[int], seen: dict[int, dict[int, int]]) -> None:
    """Which tier each client trained in, rounds per tier, and the accuracy over time."""
    print("\n[demo] client  delay  tasks per tier (0 = profiling)")
    for k in range(clients):
        counts = seen.get(k, {})
        print(f"[demo] {k:6d}  {'slow' if k in slow else '-':>5s}  {dict(sorted(counts.items()))}")
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines() if line.strip()]
    evals = [e for e in events if e.get("event") == "evaluation"]
    versions = [e for e in events if e.get("event") == "global"]
    if versions:
        print(f"[demo] {versions[-1]['version']} global versions; tier rounds merged {versions[-1]['tier_counts']}")
    if evals:
        line = ", ".join(f"{e['time']:.0f}s {e['accuracy']:.2f}" for e in evals[:: max(1, len(evals) // 12)])
        print(f"[demo] federated accuracy over time: {line}")
        print(f"[demo] best {max(e['accuracy'] for e in evals):.3f}, last {evals[-1]['accuracy']:.3f}")


def main(argv: list[str] | None = None) -> None:
    """The command line."""
    p = argparse.ArgumentParser(prog="python -m fedat_digits.demo", description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=6)
    p.add_argument("--slow", type=int, default=2, help="how many clients (the last ones) answer late")
    p.add_argument("--delay", type=float, default=3.0, help="seconds a slow client waits before each answer")
    p.add_argument("--minutes", type=float, default=3.0)
    p.add_argument("--results", type=Path, default=Path("results"))
    args = p.parse_args(argv)
    found: dict[str, str] = {}
    ready = threading.Event()
    serve = subprocess.Popen(
        [sys.executable, "-m", "fedat.cli", "serve", str(EXPERIMENT), "--clients", str(args.clients),
         "--results", str(args.results)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
    )  # fmt: skip
    threading.Thread(target=relay, args=(serve, found, ready), daemon=True).start()
    clients: list[subprocess.Popen] = []
    slow = set(range(args.clients - args.slow, args.clients))
    ports = [METRICS_BASE + k for k in range(args.clients)]
    seen: dict[int, dict[int, int]] = {}
    try:
        ready.wait(600)
        if "run" not in found or serve.poll() is not None:
            raise SystemExit("[demo] fedat serve did not start (its output is above)")
        folders = args.results / found["run"] / "clients"
        shards.write(args.clients, folders)  # each client's own digits, in its own enrollment folder
        for k in range(args.clients):
            folder = folders / f"client-{k}"
            env = {**os.environ, "FEDAT_DATA_ROOT": str(folder), "FEDAT_METRICS_PORT": str(ports[k])}
            cmd = [sys.executable, "-m", "fedat_worker.client_main", "--env", str(folder / "client.env")]
            cmd += ["--delay", str(args.delay)] if k in slow else []
            log = open(folder / "client.log", "w")  # noqa: SIM115 — the process keeps it
            clients.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT))
            print(f"[demo] client {k}: {' '.join(cmd[2:])}{'   (slow)' if k in slow else ''}", flush=True)
        end = time.time() + args.minutes * 60
        while serve.poll() is None and time.time() < end:
            time.sleep(2)
            for k, port in enumerate(ports):
                seen[k] = tiers_of(port) or seen.get(k, {})
    except KeyboardInterrupt:
        pass
    finally:
        for c in clients:  # the clients first, so that each says it leaves while the server side still runs
            c.terminate()
        for c in clients:
            c.wait(30)
        serve.send_signal(signal.SIGINT)
        serve.wait(120)
    if "run" in found:
        summary(args.results / found["run"], args.clients, slow, seen)


if __name__ == "__main__":
    main()

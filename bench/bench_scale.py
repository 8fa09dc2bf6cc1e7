"""Scale benchmark: the same real run (experiments/scale-1000.yaml) with 100, 500 and 1,000 clients, one after the
other in one invocation: peak RSS of every process and in total (target <= 8 GiB), profiling time, mean round
duration per tier, barrier/aggregator handling time per message, and the broker's deepest queues."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections import defaultdict
from pathlib import Path

import scrape  # bench/scrape.py: the management API and /metrics
import yaml

ROOT = Path(__file__).resolve().parents[1]
SIZES = (100, 500, 1000)
MINUTES = float(os.environ.get("FEDAT_BENCH_SCALE_MINUTES", "2.5"))


def _series(text: str, name: str) -> dict[str, float]:
    """label set -> value of every sample of `name`."""
    out = {}
    for m in re.finditer(rf"^{re.escape(name)}(\{{[^}}]*\}})? ([0-9.eE+-]+)$", text, re.M):
        out[m.group(1) or ""] = float(m.group(2))
    return out


def _services(results: Path) -> dict[str, dict]:
    """name -> {pid, metrics_port} of a running `fedat run` (its services.json), or {} before it exists."""
    found = list(results.glob("*/services.json"))
    try:
        return json.loads(found[0].read_text()) if found else {}
    except (OSError, ValueError):
        return {}


def _hwm_kib(pid: int) -> int:
    try:
        m = re.search(r"VmHWM:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text())
        return int(m.group(1)) if m else 0
    except OSError:
        return 0


def one(n: int) -> dict:
    """Run the experiment with n clients; sample processes, metrics and queues until it ends."""
    exp = yaml.safe_load((ROOT / "experiments" / "scale-1000.yaml").read_text())
    exp["name"], exp["settings"]["num_clients"] = f"scale-{n}", n
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"scale-{n}.yaml"
        path.write_text(yaml.safe_dump(exp))
        before = {v["name"] for v in json.loads(scrape.get(f"{scrape.API}/vhosts", auth=True))}
        proc = subprocess.Popen(
            [sys.executable, "-m", "fedat.cli", "run", str(path), "--minutes", str(MINUTES), "--results", tmp],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=ROOT,
        )
        peak: dict[str, int] = {}  # service -> peak RSS (VmHWM), KiB
        total_peak = 0
        profiler_seen = assigned = None
        depth: dict[str, int] = defaultdict(int)
        barrier = aggregator = ""
        vhost = None
        while proc.poll() is None:
            services = _services(Path(tmp))
            now_total = 0
            for name, svc in services.items():
                peak[name] = max(_hwm_kib(svc["pid"]), peak.get(name, 0))
                try:
                    status = Path(f"/proc/{svc['pid']}/status").read_text()
                    now_total += int(re.search(r"VmRSS:\s+(\d+)", status).group(1))
                except (OSError, AttributeError):
                    pass
            total_peak = max(total_peak, now_total)
            port = {n: s["metrics_port"] for n, s in services.items() if s.get("metrics_port")}
            prof = scrape.metrics(port["profiler"]) if "profiler" in port else ""
            if prof and profiler_seen is None:
                profiler_seen = time.time()
            if assigned is None and _series(prof, "fedat_tier_assignments_total").get("", 0) >= 1:
                assigned = time.time()
            barrier = (scrape.metrics(port["barrier"]) if "barrier" in port else "") or barrier
            aggregator = (scrape.metrics(port["aggregator"]) if "aggregator" in port else "") or aggregator
            if vhost is None:
                new = {v["name"] for v in json.loads(scrape.get(f"{scrape.API}/vhosts", auth=True))} - before
                vhost = next((v for v in new if v.startswith("fedat-run-")), None)
            if vhost:
                try:
                    qs = json.loads(scrape.get(f"{scrape.API}/queues/{urllib.parse.quote(vhost, safe='')}", auth=True))
                    for q in qs:
                        depth[q["name"]] = max(depth[q["name"]], int(q.get("messages", 0)))
                except OSError:
                    pass
            time.sleep(2)
        summary = json.loads(next(Path(tmp).glob("*/summary.json")).read_text())
    by_role: dict[str, int] = defaultdict(int)
    for name, kib in peak.items():
        by_role[name.split("-")[0]] = max(by_role[name.split("-")[0]], kib)
    rounds = {}
    s, c = _series(barrier, "fedat_tier_round_seconds_sum"), _series(barrier, "fedat_tier_round_seconds_count")
    for labels, total in s.items():
        tier = re.search(r'tier="(\d+)"', labels).group(1)
        rounds[tier] = total / c[labels] if c.get(labels) else float("nan")
    handling = {}
    for name, text in (("barrier", barrier), ("aggregator", aggregator)):
        s, c = _series(text, "fedat_handle_seconds_sum"), _series(text, "fedat_handle_seconds_count")
        tot, cnt = sum(s.values()), sum(c.values())
        handling[name] = (tot / cnt * 1000) if cnt else float("nan")
    deepest = sorted(depth.items(), key=lambda kv: -kv[1])[:3]
    return {
        "clients": n,
        "rss_mib_by_role": {r: round(k / 1024) for r, k in sorted(by_role.items())},
        "rss_total_peak_mib": round(total_peak / 1024),
        "rss_sum_of_peaks_mib": round(sum(peak.values()) / 1024),
        "profiling_seconds": round(assigned - profiler_seen, 1) if assigned and profiler_seen else None,
        "round_seconds_by_tier": {t: round(v, 2) for t, v in sorted(rounds.items())},
        "handle_ms": {k: round(v, 2) for k, v in handling.items()},
        "deepest_queues": deepest,
        "global_updates": summary.get("global_updates"),
        "best_accuracy": summary.get("best_accuracy"),
    }


def main() -> None:
    """Print the scale table."""
    rows = [one(n) for n in SIZES]
    print(f"\n## Scale: experiments/scale-1000.yaml with 100 / 500 / 1,000 clients, {MINUTES:g} min each, 2 workers\n")
    header = [
        "clients",
        "peak RSS total (MiB)",
        "sum of per-process peaks (MiB)",
        "worker / evaluator / barrier / aggregator / profiler peak (MiB)",
        "profiling (s)",
        "mean round (s) per tier 1..5",
        "handling per message, barrier / aggregator (ms)",
        "deepest queues (messages)",
        "global versions",
    ]
    print("| " + " | ".join(header) + " |")
    print("|---:|---:|---:|---|---:|---|---|---|---:|")
    for r in rows:
        m = r["rss_mib_by_role"]
        roles = " / ".join(str(m.get(k, "-")) for k in ("worker", "evaluator", "barrier", "aggregator", "profiler"))
        rounds = ", ".join(f"{v:g}" for v in r["round_seconds_by_tier"].values())
        deep = ", ".join(f"{q.split('.', 1)[1]} {d}" for q, d in r["deepest_queues"])
        print(
            f"| {r['clients']} | {r['rss_total_peak_mib']} | {r['rss_sum_of_peaks_mib']} | {roles} | "
            f"{r['profiling_seconds']} | {rounds} | {r['handle_ms']['barrier']} / {r['handle_ms']['aggregator']} | "
            f"{deep} | {r['global_updates']} |"
        )
    print("\nTarget: total peak RSS <= 8 GiB at 1,000 clients; cost growing no faster than linearly in clients.")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()

"""Fault injection on a private broker (`python -m fedat.ops.chaos`, the short version of `make chaos`).

Six SIGKILLs (barrier twice, aggregator, profiler during its profiling pass, a worker, the evaluator) and one broker
restart during a 60 s FedAT run: nothing may be lost or counted twice, every disruption must be followed by new
global versions, and no service may crash on its own. Needs rabbitmq-server installed (it starts its own node).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fedat.ops.invariants import VIOLATIONS

pytestmark = [pytest.mark.broker, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]


def test_kills_and_a_broker_restart_lose_nothing_and_count_nothing_twice(tmp_path):
    cmd = [
        sys.executable,
        "-m",
        "fedat.ops.chaos",
        "--experiment",
        str(ROOT / "experiments" / "chaos.yaml"),
        "--minutes",
        "1",
        "--kills",
        "6",
        "--broker-restarts",
        "1",
        "--seed",
        "2",
        "--no-baseline",
        "--results",
        str(tmp_path),
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=420, cwd=ROOT)
    runs = list(tmp_path.iterdir())
    assert len(runs) == 1 and (runs[0] / "chaos.json").exists(), r.stdout[-4000:] + r.stderr[-4000:]
    s = json.loads((runs[0] / "chaos.json").read_text())
    report = (runs[0] / "chaos.md").read_text()
    assert sum(s["kills"].values()) >= 6 and s["broker_restarts"] == 1, report
    assert {"barrier", "aggregator", "profiler", "worker"} <= set(s["kills"]), report
    assert any(e["target"] == "profiler" and e["phase"] == "profiling" for e in s["events"]), report
    assert s["violations"] == dict.fromkeys(VIOLATIONS, 0), report
    assert s["accounted"]["updates_merged"] > 0 and s["versions"] > 10, report
    assert not s["crashes"], report
    assert s["live_at_end"], report
    assert all(e["resume_seconds"] is not None for e in s["events"]), report
    assert r.returncode == 0 and s["ok"], report + r.stderr[-3000:]

"""`fedat run`'s process table: which exits count as a failed run."""

from __future__ import annotations

import subprocess
import sys

from fedat.run import Processes


def exited(code: int) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", f"raise SystemExit({code})"])
    p.wait(timeout=30)
    return p


def test_a_service_that_exits_and_a_seed_job_that_fails_are_dead_but_a_seed_job_done_is_not(tmp_path):
    procs = Processes({}, tmp_path)
    running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        procs.procs += [("seed", exited(0), None), ("worker-0", running, None)]
        assert procs.dead() == []
        procs.procs += [("aggregator", exited(0), None), ("seed", exited(1), None)]
        assert procs.dead() == ["aggregator (exit 0)", "seed (exit 1)"]
    finally:
        running.kill()
        running.wait()

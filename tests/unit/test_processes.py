"""The local supervisor: which exits count as a failed deployment, and what a kill and a restart do."""

from __future__ import annotations

import subprocess
import sys

from fedat.deploy.supervisor import Proc, Supervisor


def exited(code: int) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", f"raise SystemExit({code})"])
    p.wait(timeout=30)
    return p


def proc(name: str, popen: subprocess.Popen) -> Proc:
    p = Proc(name, "unused", {})
    p.popen = popen
    return p


def test_a_service_that_exits_and_a_seed_job_that_fails_are_dead_but_a_seed_job_done_is_not(tmp_path):
    sup = Supervisor({}, tmp_path)
    running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        sup.procs.update({"seed": proc("seed", exited(0)), "worker-0": proc("worker-0", running)})
        assert sup.describe_exits() == []
        sup.procs.update({"aggregator": proc("aggregator", exited(0)), "seed": proc("seed", exited(1))})
        assert sup.describe_exits() == ["seed (exit 1)", "aggregator (exit 0)"]
    finally:
        running.kill()
        running.wait()


def test_a_killed_process_is_not_an_exit_and_a_restart_starts_it_again(tmp_path):
    sup = Supervisor({}, tmp_path)
    sup.procs["worker-0"] = Proc("worker-0", "fedat_no_such_module", {})  # its start is what is checked
    sup.procs["worker-0"].popen = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    sup.kill("worker-0")
    assert sup.exited() == [] and sup.procs["worker-0"].stopped
    sup.restart("worker-0")
    try:
        p = sup.procs["worker-0"]
        assert p.starts == 1 and not p.stopped
        p.popen.wait(timeout=30)  # the module does not exist: it exits at once, and now that is an exit
        assert [q.name for q in sup.exited()] == ["worker-0"]
        assert (tmp_path / "worker-0.log").read_text().count("No module named") == 1
    finally:
        sup.close()

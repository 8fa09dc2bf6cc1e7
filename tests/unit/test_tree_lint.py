"""The tree passes the checks `make lint` runs (ruff's rules and format), and every benchmark still imports.

`make bench` is run by hand, so nothing else would notice a benchmark that a refactor broke until someone needs it.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUFF = Path(sys.executable).with_name("ruff")
TREES = ["src", "services", "tests", "bench"]
BENCHES = sorted((ROOT / "bench").glob("bench_*.py"))


@pytest.mark.skipif(not RUFF.exists(), reason="ruff is not installed (make setup installs it)")
@pytest.mark.parametrize("check", [["check"], ["format", "--check"]], ids=["rules", "format"])
def test_the_tree_passes_ruff(check):
    done = subprocess.run([str(RUFF), *check, *TREES], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_ruff_sees_a_broken_file(tmp_path):
    if not RUFF.exists():
        pytest.skip("ruff is not installed (make setup installs it)")
    (tmp_path / "bad.py").write_text("import os\n\ndef f( x ):\n    return undefined_name\n")
    for check in (["check"], ["format", "--check"]):
        done = subprocess.run([str(RUFF), *check, "bad.py"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert done.returncode == 1, check


@pytest.mark.parametrize("path", BENCHES, ids=[p.stem for p in BENCHES])
def test_every_benchmark_imports_and_has_a_main(path, monkeypatch):
    monkeypatch.syspath_prepend(str(path.parent))  # a benchmark imports its sibling helpers by name
    spec = importlib.util.spec_from_file_location(f"bench_under_test_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # dataclasses look their module up there
    spec.loader.exec_module(module)  # runs nothing: each benchmark starts under `if __name__ == "__main__"`
    assert callable(getattr(module, "main", None)), f"{path.name} has no main()"


def test_make_bench_runs_every_benchmark():
    makefile = (ROOT / "Makefile").read_text()
    recipe = makefile.split("\nbench:", 1)[1].split("\n\n", 1)[0]
    assert {p.name for p in BENCHES} == {line.split("bench/")[1].split()[0] for line in recipe.splitlines()[1:]}

"""The layers contract (.importlinter) holds for the tree, and breaks when a bottom package imports an upper one."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT = Path(sys.executable).with_name("lint-imports")
PACKAGES = {
    "fedat": ROOT / "src" / "fedat",
    "fedat_aggregator": ROOT / "services" / "aggregator" / "fedat_aggregator",
    "fedat_profiler": ROOT / "services" / "profiler" / "fedat_profiler",
    "fedat_worker": ROOT / "services" / "worker" / "fedat_worker",
    "fedat_sim": ROOT / "services" / "simulator" / "fedat_sim",
}

pytestmark = pytest.mark.skipif(not LINT.exists(), reason="import-linter is not installed (make setup installs it)")


def lint(tree: Path | None = None) -> subprocess.CompletedProcess:
    """lint-imports on the repository's contract, over `tree` (a copy of the packages) or the real tree."""
    env = dict(os.environ)
    if tree is not None:  # ahead of the editable installs on the path
        env["PYTHONPATH"] = str(tree)
    return subprocess.run(
        [str(LINT), "--config", str(ROOT / ".importlinter"), "--no-cache"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def copy_packages(dest: Path) -> Path:
    for name, src in PACKAGES.items():
        shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def test_the_tree_keeps_every_contract():
    r = lint()
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "0 broken" in r.stdout


@pytest.mark.parametrize(
    "module, line, broken",
    [
        ("fedat/protocol/wire.py", "from fedat.lab import run  # noqa", "Layers"),
        ("fedat/fl/aggregate.py", "from fedat.runtime import config  # noqa", "Layers"),
        ("fedat_aggregator/barrier.py", "from fedat_worker import trainer  # noqa", "Layers"),
        ("fedat/protocol/codec.py", "import pika  # noqa", "The math and the protocol"),
    ],
)
def test_an_import_pointing_up_breaks_the_contract(tmp_path, module, line, broken):
    tree = copy_packages(tmp_path)
    target = tree / module
    target.write_text(target.read_text() + f"\n{line}\n")
    r = lint(tree)
    assert r.returncode != 0, r.stdout[-3000:]
    assert broken in r.stdout and "BROKEN" in r.stdout, r.stdout[-3000:]

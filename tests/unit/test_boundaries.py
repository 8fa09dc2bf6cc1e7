"""Import boundaries: the core, aggregator and profiler never pull TensorFlow in; the worker's trainer does."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

TF_FREE = [
    "fedat",
    "fedat.protocol.codec",
    "fedat.protocol.wire",
    "fedat.fl.aggregate",
    "fedat.fl.tiering",
    "fedat.runtime.bus",
    "fedat_aggregator.barrier",
    "fedat_aggregator.aggregator",
    "fedat_aggregator.barrier_main",
    "fedat_aggregator.aggregator_main",
    "fedat_profiler.profiler",
    "fedat_profiler.main",
]


def _tf_loaded_after_importing(modules: list[str]) -> str:
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}:\n"
        "    importlib.import_module(m)\n"
        "print('tensorflow' in sys.modules)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().splitlines()[-1]


def test_core_aggregator_and_profiler_do_not_import_tensorflow():
    assert _tf_loaded_after_importing(TF_FREE) == "False"


@pytest.mark.tf
@pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="TensorFlow not installed")
def test_worker_trainer_imports_tensorflow():
    assert _tf_loaded_after_importing(["fedat_worker.trainer"]) == "True"

"""`make test` runs the tests marked `alone` one at a time and the rest together: the marks must say which is which."""

from __future__ import annotations

import ast
from pathlib import Path

INTEGRATION = Path(__file__).resolve().parents[1] / "integration"
# TensorFlow in virtual time only: the simulator's clock does not depend on how busy the machine is.
VIRTUAL_TIME = {"test_compare_simulate.py"}


def marks(path: Path) -> set[str]:
    """The names of the module-level `pytestmark` marks of a test file."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "pytestmark" for t in node.targets):
            values = node.value.elts if isinstance(node.value, ast.List) else [node.value]
            return {v.attr for v in values if isinstance(v, ast.Attribute)}
    return set()


def test_every_integration_module_that_trains_in_real_time_runs_alone():
    trains = {p.name for p in INTEGRATION.glob("test_*.py") if "tf" in marks(p)} - VIRTUAL_TIME
    assert trains, "no integration module is marked tf: the marks moved"
    assert {n for n in trains if "alone" not in marks(INTEGRATION / n)} == set()


def test_the_marks_are_read():
    assert marks(INTEGRATION / "test_fidelity.py") >= {"broker", "tf", "alone"}
    assert "alone" not in marks(INTEGRATION / "test_pipeline.py")

"""The recorder writes one line per global version and per evaluated version, whatever is redelivered."""

from __future__ import annotations

import io
import json

from fedat.lab.recorder import Recorder, RunState
from fedat.protocol import topology
from fedat.protocol.wire import Evaluation

from ..driver import Driver
from ..factories import seed


def test_a_version_scored_twice_by_a_restarted_evaluator_is_recorded_once():
    out = io.StringIO()
    d = Driver(Recorder(RunState(started_at=0.0), out))
    d.deliver(topology.RECORDER_GLOBAL, seed(1))
    d.deliver(topology.RECORDER_GLOBAL, seed(1))  # redelivered
    ev = Evaluation("e0", 0, 0.5, 1.0, 0.1, 4, 2.0, accuracies=(0.5,) * 4)
    first = d.deliver(topology.RECORDER_EVENTS, ev)
    again = d.deliver(topology.RECORDER_EVENTS, ev)
    assert first.ack and again.ack == (d.tag,)
    lines = [json.loads(x) for x in out.getvalue().splitlines()]
    assert [x["event"] for x in lines] == ["global", "evaluation"]

"""The recorder: follows global models and evaluations and writes a run's `events.jsonl`."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from typing import IO

from prometheus_client import CollectorRegistry

from fedat.deploy.vhost import Vhost
from fedat.protocol import topology
from fedat.protocol.service import Effects, Inbound, Reactive, Subscription, done
from fedat.protocol.system import BY_NAME
from fedat.protocol.wire import Evaluation, GlobalModel
from fedat.runtime.bus import BrokerConfig, run_service
from fedat.runtime.metrics import transport_metrics


@dataclass
class RunState:
    """What the run has seen so far (read by the progress display from another thread)."""

    started_at: float
    version: int = 0
    tier_counts: tuple[int, ...] = ()
    bytes_up: int = 0
    bytes_down: int = 0
    late: int = 0
    updates: int = 0
    evaluations: list[dict] = field(default_factory=list)
    bytes_at: dict[int, tuple[int, int]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


class Recorder(Reactive):
    """One `global` line per global update and one `evaluation` line per score, as they arrive."""

    name = "recorder"

    def __init__(self, state: RunState, out: IO[str]):
        self.state, self.out = state, out

    def initial(self) -> None:
        """Its memory is the run's `RunState` (shared with the progress display) and the file it writes."""
        return None

    def subscriptions(self) -> dict[str, Subscription]:
        """Global models and evaluation events."""
        return {
            topology.RECORDER_GLOBAL: Subscription(GlobalModel, self.on_global),
            topology.RECORDER_EVENTS: Subscription(Evaluation, self.on_evaluation),
        }

    def on_global(self, state: None, inbound: Inbound, now: float, held) -> tuple[None, Effects]:
        """One `global` line per version (a redelivered version is ignored)."""
        msg: GlobalModel = inbound.message
        s = self.state
        with s.lock:
            if msg.version in s.bytes_at:
                return state, done(inbound)  # redelivered
            s.bytes_at[msg.version] = (msg.bytes_up, msg.bytes_down)
            if msg.version >= s.version:  # observers may see versions out of order: totals follow the newest
                s.version, s.tier_counts = msg.version, msg.tier_counts
                s.bytes_up, s.bytes_down, s.late, s.updates = msg.bytes_up, msg.bytes_down, msg.late, msg.updates
            last = s.evaluations[-1] if s.evaluations else {}
            self._write(
                {
                    "event": "global",
                    "time": round(max(0.0, msg.created_at - s.started_at), 3),  # the seed may come first
                    "version": msg.version,
                    "tier": msg.tier,
                    "tier_round": msg.tier_round,
                    "tier_counts": list(msg.tier_counts),
                    "tier_weights": [round(w, 4) for w in msg.tier_weights],
                    "accuracy": last.get("accuracy"),
                    "variance": last.get("variance"),
                    "evaluated_version": last.get("version"),
                    "bytes_up": msg.bytes_up,
                    "bytes_down": msg.bytes_down,
                    "late": msg.late,
                    "updates": msg.updates,
                }
            )
        return state, done(inbound)

    def on_evaluation(self, state: None, inbound: Inbound, now: float, held) -> tuple[None, Effects]:
        """One `evaluation` line, with the traffic up to the evaluated version."""
        msg: Evaluation = inbound.message
        s = self.state
        with s.lock:
            if any(e["version"] == msg.version for e in s.evaluations):
                return state, done(inbound)  # a restarted evaluator scored a redelivered version again
            line = {
                "event": "evaluation",
                "time": round(max(0.0, msg.evaluated_at - s.started_at), 3),
                "version": msg.version,
                "accuracy": msg.accuracy,
                "loss": msg.loss,
                "variance": msg.variance,
                # Traffic up to the evaluated version, so that accuracy-vs-bytes pairs the right numbers.
                "bytes_up": s.bytes_at.get(msg.version, (s.bytes_up, s.bytes_down))[0],
                "bytes_down": s.bytes_at.get(msg.version, (s.bytes_up, s.bytes_down))[1],
            }
            s.evaluations.append(line)
            self._write(line)
        return state, done(inbound)

    def _write(self, line: dict) -> None:
        self.out.write(json.dumps(line) + "\n")
        self.out.flush()


def record_in_thread(vhost: Vhost, num_tiers: int, state: RunState, out: IO[str], stop: threading.Event):
    """A started daemon thread running the recorder on `vhost` as its role's user, until `stop` is set; its transport
    metrics go to a private registry that is not served."""
    broker = BrokerConfig(
        url=vhost.url("recorder"),
        num_tiers=num_tiers,
        prefetch=BY_NAME["recorder"].prefetch,
        declare=vhost.declare,
        keyring=vhost.keyring("recorder"),
    )
    metrics = transport_metrics(CollectorRegistry(), "recorder")
    thread = threading.Thread(target=run_service, args=(Recorder(state, out), broker, metrics, stop), daemon=True)
    thread.start()
    return thread

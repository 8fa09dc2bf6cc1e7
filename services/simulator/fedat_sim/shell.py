"""One service as a process on the memory broker: `fedat.runtime.bus.run_service`'s loop, in virtual time.

The transport code is the production code. `fedat.runtime.bus.Runner` (state, checkpoint sequence, restore, write-ahead
save) and `fedat.runtime.bus.Session` (decode and verify, handler, then `commit`: encode → checkpoint → publish →
dead-letter → ack → hold → timers → observe; dead-lettering; requeue on a handler error) run unchanged over a
`MemoryConnection`/`MemoryChannel` in place of pika's. Only `run_service`'s loop is pika-bound (a blocking
`process_data_events` loop with `stop.wait` backoff), so `Process` mirrors it step for step:

    connect → channel → confirm_delivery → declare (if cfg.declare) → basic_qos(prefetch) → Session.start()
    (restore the checkpoint and re-send its outbox, on_start, consume) → serve; on a RECOVERABLE error: refuse
    on 403, else drop the connection and reconnect after a backoff of 0.5 s doubling to cfg.max_backoff.

One difference: `run_service` groups the transitions of one dispatch behind one checkpoint (`Session(group=True)`),
a saving in confirmed writes that virtual time does not have; here each transition is committed as it is handled,
so a run replays exactly. The grouping itself is tested on this broker (tests/unit/test_sim_shell.py). Another:
`run_service` publishes each outbox as one transaction through a `Publisher` on a second connection; here each
message is confirmed on the session's channel, as one-shot publishes are (the Publisher is tested on RabbitMQ,
tests/integration/test_publisher.py).

The Runner outlives connections (a reconnect keeps the in-memory state and restores the checkpoint over it); a
crash (`kill`) throws the Runner away, and the restarted process starts from `initial()` and its checkpoint, as a
SIGKILLed pod restarted by Kubernetes does.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry

from fedat.protocol import topology
from fedat.protocol.service import Observation, Service
from fedat.runtime.brokerstore import Store
from fedat.runtime.bus import RECOVERABLE, BrokerConfig, BrokerRefused, Runner, Session, refused
from fedat.runtime.metrics import TransportMetrics, transport_metrics
from fedat_sim.clock import Clock
from fedat_sim.memory import MemoryBroker, MemoryConnection

FIRST_BACKOFF = 0.5  # run_service's first wait after a lost connection


class ProcessKilled(BaseException):
    """Raised inside a transition to kill the process right there (SIGKILL); BaseException, so no handler eats it."""

    def __init__(self, restart_after: float | None = 1.0):
        super().__init__(f"killed (restart after {restart_after} s)")
        self.restart_after = restart_after


class ServiceDied(RuntimeError):
    """A service raised something the transport does not survive: in `fedat run` its process exits and the run fails."""


class Process:
    """A service process on the memory broker: connects, serves, reconnects, crashes and restarts in virtual time."""

    def __init__(
        self,
        name: str,
        service: Service,
        broker: MemoryBroker,
        clock: Clock,
        cfg: BrokerConfig,
        persist: bool = True,
        observe: Callable[[Observation], None] | None = None,
        configure: Callable[[MemoryConnection], None] | None = None,
        store: Callable[[], Store] | None = None,
    ):
        self.name, self.service, self.broker, self.clock, self.cfg = name, service, broker, clock, cfg
        self.persist, self.observe, self.configure = persist, observe, configure
        self.store = store  # makes the store of each start; None: the Runner's own (`BrokerStore`)
        self.metrics: TransportMetrics = transport_metrics(CollectorRegistry(), name)
        self.runner: Runner | None = None
        self.conn: MemoryConnection | None = None
        self.backoff = FIRST_BACKOFF
        self.running = False  # started and not stopped (it may be between connections)
        self.crashes = 0
        self.reconnects = 0

    @property
    def connected(self) -> bool:
        """Whether the process holds an open connection."""
        return self.conn is not None and self.conn.is_open

    def start(self) -> None:
        """Start the process (a fresh Runner: initial state, restored from its checkpoint on connect)."""
        self.running = True
        store = self.store() if self.store is not None else None
        self.runner = Runner(self.service, self.cfg, self.metrics, self.clock, self.persist, self.observe, store=store)
        self.backoff = FIRST_BACKOFF
        self._connect()

    def _connect(self) -> None:
        if not self.running or self.runner is None or self.connected:
            return
        conn = self.broker.connect(self.name)
        conn.on_error = self._failed
        if self.configure is not None:
            self.configure(conn)
        self.conn = conn
        try:
            channel = conn.channel()
            channel.confirm_delivery()
            if self.cfg.declare:
                topology.declare(channel, self.cfg.num_tiers)
            channel.basic_qos(prefetch_count=self.cfg.prefetch)
            Session(conn, channel, self.runner).start()
        except BaseException as exc:
            self._failed(exc)
            return
        self.metrics.connected.set(1)
        self.backoff = FIRST_BACKOFF

    def _failed(self, exc: BaseException) -> None:
        """What escapes a callback: a kill, a lost connection (reconnect), or a death (the run fails)."""
        if isinstance(exc, ProcessKilled):
            self.kill(exc.restart_after)
            return
        if isinstance(exc, RECOVERABLE):
            if refused(exc):
                raise BrokerRefused(f"{self.name}: the broker refused access ({exc})") from exc
            self.drop()
            return
        self.stop()
        raise ServiceDied(
            f"{self.name} died at virtual time {self.clock.now:.3f}: {type(exc).__name__}: {exc}"
        ) from exc

    def drop(self) -> None:
        """The connection is lost: held deliveries go back, timers are lost; reconnect after the backoff."""
        if self.conn is None or not self.conn.is_open:
            return
        self.conn.close()
        self.metrics.connected.set(0)
        self.metrics.reconnects.inc()
        self.reconnects += 1
        self.clock.after(self.backoff, self._connect, f"reconnect {self.name}")
        self.backoff = min(self.backoff * 2, self.cfg.max_backoff)

    def kill(self, restart_after: float | None = 1.0) -> None:
        """SIGKILL: the connection and the in-memory state are gone; restart after `restart_after` (None: never)."""
        if self.conn is not None:
            self.conn.close()
        self.conn, self.runner = None, None
        self.metrics.connected.set(0)
        self.crashes += 1
        self.running = False
        if restart_after is not None:
            self.clock.after(restart_after, self.start, f"restart {self.name}")

    def stop(self) -> None:
        """Stop for good (the end of a run)."""
        self.running = False
        if self.conn is not None:
            self.conn.close()
        self.metrics.connected.set(0)

    def handler_errors(self) -> int:
        """Handler and timer failures the shell caught (requeued or logged): a bug unless a fault caused it."""
        total = 0.0
        for family in self.metrics.registry.collect():
            for sample in family.samples:
                if sample.name == "fedat_messages_consumed_total" and sample.labels.get("outcome") == "error":
                    total += sample.value
        return int(total)

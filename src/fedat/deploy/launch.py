"""Starting a whole deployment as local processes, phase by phase, as the system table says."""

from __future__ import annotations

from collections.abc import Callable

from fedat.deploy.ports import free_ports
from fedat.deploy.supervisor import Supervisor, reports_connected
from fedat.deploy.vhost import Vhost
from fedat.protocol.system import Kind, Mode, Phase, processes, service, start_order

START_TIMEOUT = 180.0  # services connecting at start (TensorFlow processes start slowly on 2 cores)


def process_names(workers: int, mode: Mode = Mode.POOL) -> list[str]:
    """Every process of a deployment whose clients are `mode`, with `workers` worker processes (`worker-0`, ...)."""
    names: list[str] = []
    for s in processes(mode):
        names += [f"{s.name}-{i}" for i in range(workers)] if s.kind is Kind.SCALED else [s.name]
    return names


def metrics_ports(names: list[str]) -> dict[str, int]:
    """A free 127.0.0.1 port for every process that serves metrics (free, not fixed: two runs must not collide)."""
    serving = [n for n in names if service(n).metrics_port]
    return dict(zip(serving, free_ports(len(serving)), strict=True))


def launch(
    sup: Supervisor,
    vhost: Vhost,
    names: list[str],
    ports: dict[str, int],
    before: Callable[[Phase, list[str]], None] = lambda phase, names: None,
    timeout: float = START_TIMEOUT,
) -> None:
    """Start `names` phase by phase; each phase waits until the previous phase's services report a connection.

    `before(phase, names)` runs just before a phase starts (a launcher's clock or progress line).
    """
    previous: list[int] = []
    for group in start_order(names):
        if previous:
            sup.wait_until(lambda ps=previous: all(reports_connected(p) for p in ps), timeout, "services to connect")
        before(service(group[0]).phase, group)
        for name in group:
            sup.start(name, {**vhost.env(service(name).name), "FEDAT_METRICS_PORT": str(ports.get(name, 0))})
        previous = [ports[n] for n in group if n in ports]

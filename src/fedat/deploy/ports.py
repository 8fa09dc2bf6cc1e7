"""Loopback TCP ports for listeners we start ourselves, chosen outside the kernel's ephemeral port range.

A port handed out by `bind(0)` comes from the ephemeral range, the same range the kernel draws the *source* port of
every outgoing connection from. A listener that goes away and must come back on its port (a private RabbitMQ node
restarted by a chaos test, a killed service's metrics server) can then find its port taken by some client's
connection, and on loopback a client reconnecting to the absent listener can even connect to itself (TCP
simultaneous open) and hold the port. That is the likely (not proven) cause of a chaos test's private node that
once did not come back after its restart. Ports outside the ephemeral range are never picked as source ports, so
only another listener can take them.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

LOWEST = 10000  # below: well-known and registered services (PostgreSQL, Redis, MariaDB, Mosquitto, NATS, RabbitMQ)
# RabbitMQ's own fixed ports, and rabbitmqctl's distribution listener range 35672-35682.
RESERVED = frozenset(range(35672, 35683)) | {4369, 5671, 5672, 15672, 15692, 25672}
_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def ephemeral_range(text: str | None = None) -> tuple[int, int]:
    """The kernel's ephemeral port range (Linux default 32768-60999 when it cannot be read)."""
    try:
        lo, hi = (int(x) for x in (text if text is not None else _RANGE_FILE.read_text()).split())
    except (OSError, ValueError):
        return 32768, 60999
    return lo, hi


def candidate_ports(ephemeral: tuple[int, int]) -> list[int]:
    """Ports outside `ephemeral` and RESERVED, from LOWEST up: below the range, or above it if below is too small."""
    lo, hi = ephemeral
    below = [p for p in range(LOWEST, lo) if p not in RESERVED]
    above = [p for p in range(hi + 1, 65536) if p not in RESERVED]
    return below if len(below) >= len(above) else above


def free_ports(n: int, rng: random.Random | None = None) -> list[int]:
    """n distinct ports free on 127.0.0.1 now, outside the ephemeral range (held together while choosing)."""
    ephemeral = ephemeral_range()
    pool = candidate_ports(ephemeral)
    (rng or random.SystemRandom()).shuffle(pool)  # separate processes choosing at once rarely collide
    socks: list[socket.socket] = []
    ports: list[int] = []
    try:
        for port in pool:
            if len(ports) == n:
                break
            s = socket.socket()
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                s.close()
                continue
            socks.append(s)
            ports.append(port)
    finally:
        for s in socks:
            s.close()
    if len(ports) < n:
        raise OSError(f"only {len(ports)} of {n} loopback ports free outside the ephemeral range {ephemeral}")
    return ports


def free_port() -> int:
    """One port free on 127.0.0.1 now, outside the ephemeral range."""
    return free_ports(1)[0]

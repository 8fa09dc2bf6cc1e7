"""Listener ports are chosen outside the kernel's ephemeral range, so no outgoing connection can take them."""

from __future__ import annotations

import random
import socket

import pytest

from fedat.deploy import ports


def test_the_kernel_range_is_read_and_a_bad_one_falls_back_to_linux_defaults():
    assert ports.ephemeral_range("32768\t60999\n") == (32768, 60999)
    assert ports.ephemeral_range("1024 65000") == (1024, 65000)
    assert ports.ephemeral_range("garbage") == (32768, 60999)


def test_candidates_avoid_the_ephemeral_range_and_rabbitmqs_ports():
    below = ports.candidate_ports((32768, 60999))
    assert min(below) == ports.LOWEST and max(below) == 32767
    assert not ports.RESERVED & set(below)
    # A range reaching down to LOWEST leaves only the ports above it.
    above = ports.candidate_ports((5000, 40000))
    assert min(above) == 40001 and max(above) == 65535


def test_free_ports_are_distinct_bindable_and_outside_this_machines_range():
    lo, hi = ports.ephemeral_range()
    got = ports.free_ports(20, random.Random(7))
    assert len(set(got)) == 20
    assert all(not lo <= p <= hi and p not in ports.RESERVED for p in got)
    for p in got:
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))


def test_a_port_that_is_taken_is_skipped():
    first = ports.free_ports(1, random.Random(3))[0]
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", first))
        holder.listen()
        assert first not in ports.free_ports(5, random.Random(3))


def test_no_candidates_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(ports, "ephemeral_range", lambda text=None: (1024, 65535))
    with pytest.raises(OSError, match="0 of 2 loopback ports"):
        ports.free_ports(2)

"""Shared fixtures: a fresh RabbitMQ vhost per test session, deleted afterwards."""

from __future__ import annotations

import os
import socket
import uuid

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def pytest_collection_modifyitems(items):
    """The tests marked slow first: dealt out last to several workers, a long test would run on alone at the end."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def _broker_answers() -> bool:
    try:
        with socket.create_connection(("127.0.0.1", 5672), timeout=2):
            return True
    except OSError:
        return False


@pytest.fixture
def vhost_url():
    """AMQP URL of a vhost that exists only for this test (deleted afterwards, whatever happened)."""
    if not _broker_answers():
        pytest.fail("no RabbitMQ on 127.0.0.1:5672: run `make test`, which starts one (infra/ensure-broker.sh)")
    from fedat.ops import broker_admin

    name = f"fedat-test-{uuid.uuid4().hex[:8]}"
    url = broker_admin.create_vhost(name)
    yield url
    broker_admin.delete_vhost(name)

"""The store's room: the private PostgreSQL server its tests share (tests/support/postgres.py: one server per test
module, made by this user on loopback, with a fresh database per test where a test asks for one; the tests skip
with the set-up's reason where PostgreSQL cannot be had)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.postgres import PrivateServer, private_server


@pytest.fixture(scope="module")
def pg() -> Iterator[PrivateServer]:
    yield from private_server()

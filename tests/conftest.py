"""Fixtures shared by every tier."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from duplex_dev.launch.redis import RedisServer


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    """A real redis-server on a free loopback port. Missing is a failure, never a skip: hack/setup.sh installs it."""
    if not RedisServer.available():
        pytest.fail(
            "redis-server is missing: run hack/setup.sh (it installs Debian's redis-server); "
            "the Redis store is tested against a real server, never skipped",
            pytrace=False,
        )
    with RedisServer() as server:
        yield server

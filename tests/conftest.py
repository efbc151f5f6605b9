"""Fixtures shared by every tier."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

from duplex_dev.launch.redis import RedisServer

# Property tests check behaviour, not speed: no per-example deadline and no too-slow health check, which on a shared
# 2-core machine fail for reasons that have nothing to do with the code (speed lives in the benchmarks).
settings.register_profile("duplex", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("duplex")


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

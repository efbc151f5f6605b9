"""Store semantics, the same for both stores: single use, TTL (with an `expired` grace), bound, drop by endpoint;
and a Redis that is down costs a bounded wait and a StoreError, never a hang."""

from __future__ import annotations

import asyncio
import os
import time
from typing import AsyncIterator, Iterator

import pytest

from duplex_sidecars.router.history import Covered
from duplex_sidecars.router.launcher import RedisServer
from duplex_sidecars.router.store import (
    ENDPOINT_GONE,
    EXPIRED_GRACE_SECONDS,
    Entry,
    MemoryStore,
    RedisStore,
    StoreError,
)

D1 = "http://10.0.0.1:8000"
D2 = "http://10.0.0.2:8000"


def entry(url: str = D1, n: int = 1) -> Entry:
    return Entry(decode_url=url, params={"remote_engine_id": "d", "remote_num_tokens": n},
                 covered=Covered("messages", "abc", 3), scope="s")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    if not RedisServer.available():
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail("CI: redis-server is missing (hack/setup.sh installs it); this is a failure, not a skip")
        pytest.skip("redis-server not installed (apt-get install -y redis-server)")
    with RedisServer() as server:
        yield server


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
async def store(request) -> AsyncIterator:
    if request.param == "memory":
        yield MemoryStore(max_entries=100)
        return
    server = request.getfixturevalue("redis_server")
    s = RedisStore(server.url, f"test:{time.monotonic_ns()}:", op_timeout=1.0, error_backoff=0.0)
    yield s
    await s.close()


async def test_take_is_single_use(store):
    await store.put("k", entry(), ttl=60)
    got = await store.take("k")
    assert got is not None and got.params == entry().params and got.covered == entry().covered
    assert not got.expired and got.scope == "s" and got.decode_url == D1
    assert await store.take("k") is None


async def test_put_replaces(store):
    await store.put("k", entry(n=1), ttl=60)
    await store.put("k", entry(n=2), ttl=60)
    assert (await store.take("k")).params["remote_num_tokens"] == 2
    assert await store.take("k") is None


async def test_concurrent_takes_get_one_entry(store):
    await store.put("k", entry(), ttl=60)
    results = await asyncio.gather(*(store.take("k") for _ in range(20)))
    assert sum(r is not None for r in results) == 1


async def test_drop_endpoint_leaves_tombstones(store):
    await store.put("a", entry(D1), ttl=60)
    await store.put("b", entry(D2), ttl=60)
    await store.put("c", entry(D1), ttl=60)
    await store.take("c")
    assert await store.drop_endpoint(D1) == 1
    gone = await store.take("a")
    assert gone is not None and gone.params is None and gone.reason == ENDPOINT_GONE
    assert (await store.take("b")).params is not None
    assert await store.drop_endpoint("http://never") == 0


async def test_memory_ttl_and_grace():
    clock = Clock()
    s = MemoryStore(max_entries=10, clock=clock)
    await s.put("k", entry(), ttl=5)
    clock.now += 4.9
    got = await s.take("k")
    assert got is not None and not got.expired
    await s.put("k", entry(), ttl=5)
    clock.now += 5
    got = await s.take("k")
    assert got is not None and got.expired  # counted as expired, never replayed
    await s.put("k", entry(), ttl=5)
    clock.now += 5 + EXPIRED_GRACE_SECONDS
    await s.sweep()
    assert await s.size() == 0 and await s.take("k") is None


async def test_memory_sweep_is_oldest_first_and_bounded():
    clock = Clock()
    s = MemoryStore(max_entries=3, clock=clock)
    for i in range(5):
        await s.put(f"k{i}", entry(), ttl=10)
        clock.now += 1
    assert await s.size() == 3
    assert await s.take("k0") is None and await s.take("k1") is None
    assert await s.take("k4") is not None
    # the endpoint index forgets evicted keys
    assert sum(len(v) for v in s._by_endpoint.values()) == await s.size()


async def test_memory_sweep_stops_at_the_first_live_entry():
    clock = Clock()
    s = MemoryStore(max_entries=1000, clock=clock)
    for i in range(100):
        await s.put(f"k{i}", entry(), ttl=1)
    clock.now += 1 + EXPIRED_GRACE_SECONDS
    await s.put("fresh", entry(), ttl=1)
    assert await s.size() == 1


@pytest.mark.redis
async def test_redis_ttl(redis_server):
    s = RedisStore(redis_server.url, "ttl:", op_timeout=1.0, error_backoff=0.0)
    try:
        await s.put("k", entry(), ttl=0.2)
        await asyncio.sleep(0.3)
        got = await s.take("k")
        assert got is not None and got.expired
        ttl_ms = await s._redis.pttl("ttl:k")
        assert ttl_ms == -2  # taken, so gone
        await s.put("k2", entry(), ttl=0.2)
        kept = await s._redis.pttl("ttl:k2")
        assert 0 < kept <= (0.2 + EXPIRED_GRACE_SECONDS) * 1000
        assert await s.size() == 1
    finally:
        await s.close()


@pytest.mark.redis
async def test_two_clients_share_entries(redis_server):
    a = RedisStore(redis_server.url, "shared:", op_timeout=1.0, error_backoff=0.0)
    b = RedisStore(redis_server.url, "shared:", op_timeout=1.0, error_backoff=0.0)
    try:
        await a.put("k", entry(), ttl=60)
        assert (await b.take("k")) is not None
        assert await a.take("k") is None
    finally:
        await a.close()
        await b.close()


async def test_redis_down_is_a_fast_store_error():
    from duplex_sidecars.sim.launcher import free_port

    s = RedisStore(f"redis://127.0.0.1:{free_port()}/0", "x:", op_timeout=0.5, error_backoff=5.0)
    try:
        t = time.perf_counter()
        with pytest.raises(StoreError):
            await s.take("k")
        with pytest.raises(StoreError):
            await s.put("k", entry(), ttl=1)  # backing off: no second connect attempt
        assert time.perf_counter() - t < 1.0
        assert s.health()["healthy"] is False and s.errors == 1
        assert await s.ping() is False
    finally:
        await s.close()


async def test_redis_blackhole_is_bounded_by_the_op_timeout():
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)  # accepts connections, never answers
    port = listener.getsockname()[1]
    s = RedisStore(f"redis://127.0.0.1:{port}/0", "x:", op_timeout=0.3, error_backoff=0.0)
    try:
        t = time.perf_counter()
        with pytest.raises(StoreError):
            await s.take("k")
        assert time.perf_counter() - t < 1.5
    finally:
        await s.close()
        listener.close()


def test_entries_round_trip_as_json():
    e = entry()
    e.expires_at = 12.5
    back = Entry.from_json(e.to_json())
    assert back == e
    tomb = e.tombstone(ENDPOINT_GONE)
    assert Entry.from_json(tomb.to_json()).params is None

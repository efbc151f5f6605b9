"""Store semantics, the same for both stores: single use, TTL (with an `expired` grace), bounds (entries and bytes),
drop by endpoint; compact params that replay bit-identical; and a Redis that is down costs a bounded wait and a
StoreError, never a hang."""

from __future__ import annotations

import asyncio
import gc
import json
import random
import time
import zlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from duplex_sidecars import protocol
from duplex_sidecars.router import store as store_module
from duplex_sidecars.router.history import Covered
from duplex_sidecars.router.store import (
    ENDPOINT_GONE,
    ENTRY_OVERHEAD_BYTES,
    EXPIRED_GRACE_SECONDS,
    Entry,
    MemoryStore,
    RedisStore,
    StoreError,
    pack_params,
    store_mac_key,
    unpack_params,
)

D1 = "http://10.0.0.1:8000"
D2 = "http://10.0.0.2:8000"


def entry(url: str = D1, n: int = 1) -> Entry:
    return Entry(
        decode_url=url,
        params={"remote_engine_id": "d", "remote_num_tokens": n},
        covered=Covered("messages", "abc", 3),
        scope="s",
    )


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
async def store(request) -> AsyncIterator:
    if request.param == "memory":
        yield MemoryStore(max_entries=100)
        return
    server = request.getfixturevalue("redis_server")
    s = RedisStore(server.url, f"test:{time.monotonic_ns()}:", op_timeout=10.0, error_backoff=0.0)
    yield s
    await s.close()


async def test_take_is_single_use(store):
    await store.put("k", entry(), ttl=60)
    got = await store.take("k")
    assert got is not None and got.params == entry().params and got.covered == entry().covered
    assert not got.expired and got.scope == "s" and got.decode_url == D1
    assert got.remaining is not None and 0 < got.remaining <= 60  # what was left of its TTL
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


async def test_held_counts_an_endpoints_live_bindings_and_the_recent_ones(store):
    await store.put("a", entry(D1), ttl=60)
    await store.put("b", entry(D1), ttl=600)
    await store.put("c", entry(D2), ttl=600)
    await store.put("t", Entry(decode_url=D1, reason="no_params"), ttl=600)  # a tombstone binds nothing
    assert await store.held(D1) == 2 and await store.held(D2) == 1
    assert await store.held(D1, remaining=120) == 1  # "a" has under 60 s left: stored as if long ago
    await store.take("b")
    assert await store.held(D1) == 1 and await store.held(D1, remaining=120) == 0
    await store.drop_endpoint(D1)
    assert await store.held(D1) == 0


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
    assert got is not None and not got.expired and got.remaining == pytest.approx(0.1)
    await s.put("k", entry(), ttl=5)
    clock.now += 5
    got = await s.take("k")
    assert got is not None and got.expired and got.remaining == 0  # counted as expired, never replayed
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
    s = RedisStore(redis_server.url, "ttl:", op_timeout=10.0, error_backoff=0.0)
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
async def test_the_redis_endpoint_index_holds_only_what_can_still_exist(redis_server, monkeypatch):
    # Before: keys were added to a set per endpoint and never removed, and each put renewed the set's expiry, so a
    # busy endpoint's index grew for ever. Now each put prunes what has expired or been taken since.
    s = RedisStore(redis_server.url, "idx:", op_timeout=10.0, error_backoff=0.0)
    clock = [time.time()]
    monkeypatch.setattr(store_module.time, "time", lambda: clock[0])
    try:
        for i in range(50):
            await s.put(f"old{i}", entry(D1), ttl=60)
        await s.take("old0")
        index = s._endpoint_key(D1)
        assert await s._redis.zcard(index) == 50
        clock[0] += 60 + EXPIRED_GRACE_SECONDS + 1  # every old entry is past its last possible moment
        await s.put("new", entry(D1), ttl=60)
        assert [m.decode() for m in await s._redis.zrange(index, 0, -1)] == ["new"]
    finally:
        await s.close()


@pytest.mark.redis
async def test_dropping_a_redis_endpoint_reads_its_index_in_batches(redis_server, monkeypatch):
    monkeypatch.setattr(store_module, "DROP_BATCH", 3)
    s = RedisStore(redis_server.url, "drop:", op_timeout=10.0, error_backoff=0.0)
    try:
        for i in range(7):
            await s.put(f"k{i}", entry(D1), ttl=60)
        await s.put("other", entry(D2), ttl=60)
        await s.take("k3")
        assert await s.drop_endpoint(D1) == 6
        assert not await s._redis.exists(s._endpoint_key(D1))
        for i in (0, 1, 2, 4, 5, 6):
            gone = await s.take(f"k{i}")
            assert gone is not None and gone.reason == ENDPOINT_GONE
        assert (await s.take("other")).params is not None
    finally:
        await s.close()


@pytest.mark.redis
async def test_sealed_redis_entries_cannot_be_forged_or_moved(redis_server):
    # Before: whoever could write Redis could copy tenant A's entry under tenant B's key, or write one of its own.
    key = store_mac_key("the-engine-key")
    a = RedisStore(redis_server.url, "seal:", op_timeout=10.0, error_backoff=0.0, mac_key=key)
    b = RedisStore(redis_server.url, "seal:", op_timeout=10.0, error_backoff=0.0, mac_key=key)
    other = RedisStore(redis_server.url, "seal:", op_timeout=10.0, error_backoff=0.0, mac_key=store_mac_key("x"))
    unsealed = RedisStore(redis_server.url, "seal:", op_timeout=10.0, error_backoff=0.0)
    try:
        await a.put("tenant-a", entry(D1), ttl=60)
        assert (await b.take("tenant-a")).params is not None  # the routers share one secret
        await a.put("tenant-a", entry(D1), ttl=60)
        await a._redis.copy("seal:tenant-a", "seal:tenant-b")  # moved under another key
        with pytest.raises(StoreError, match="integrity"):
            await b.take("tenant-b")
        with pytest.raises(StoreError, match="integrity"):
            await other.take("tenant-a")  # sealed with another secret
        await unsealed.put("forged", entry(D1), ttl=60)  # written without the secret
        with pytest.raises(StoreError, match="integrity"):
            await a.take("forged")
        await a.put("gone", entry(D2), ttl=60)
        assert await a.drop_endpoint(D2) == 1
        assert (await b.take("gone")).reason == ENDPOINT_GONE  # tombstones are sealed too
    finally:
        for s in (a, b, other, unsealed):
            await s.close()


@pytest.mark.redis
async def test_two_clients_share_entries(redis_server):
    a = RedisStore(redis_server.url, "shared:", op_timeout=10.0, error_backoff=0.0)
    b = RedisStore(redis_server.url, "shared:", op_timeout=10.0, error_backoff=0.0)
    try:
        await a.put("k", entry(), ttl=60)
        assert (await b.take("k")) is not None
        assert await a.take("k") is None
    finally:
        await a.close()
        await b.close()


async def test_redis_down_is_a_fast_store_error():
    from duplex_dev.processes import free_port

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


def test_entries_round_trip_as_redis_values():
    e = entry()
    e.expires_at = 12.5
    back = Entry.from_bytes(e.to_bytes())
    assert back == e and back.params == e.params
    tomb = e.tombstone(ENDPOINT_GONE)
    back = Entry.from_bytes(tomb.to_bytes())
    assert back == tomb and back.params is None and not back.replayable and back.reason == ENDPOINT_GONE


@pytest.mark.parametrize("raw", [b"", b"{}", b'{"decode_url": "x"}', b"\x01\x00", b"\x01\xff\xff\xff\xffo[]"])
def test_undecodable_redis_values_are_store_errors(raw):
    with pytest.raises(StoreError):
        Entry.from_bytes(raw)


@pytest.mark.parametrize(
    "blob",
    [
        b"",
        b"not zlib",
        zlib.compress(b"\x08\x00\x00\x00\x01\x00"),
        zlib.compress(b"\x04\x00\x00\x00\x01\x00\x00\x00o[0,[2],{}]"),
        b"\x00",
        b"\x00\x08\x00\x00\x00\x01\x00",
        b"\x00\x03\x00\x00\x00\x01\x00\x00o[0,1,{}]",
        b"\x00\x04\x00\x00\x00\x01\x00\x00\x00o[0,[2],{}]",
    ],
)
def test_undecodable_params_are_store_errors(blob):
    with pytest.raises(StoreError):
        _ = Entry(D1, blob=blob).params


# ---- compact params: what the router replays is bit-identical after the round trip -----------------------------


def decode_reply(ids: list[int], groups: int = 1) -> dict[str, Any]:
    """decode's allow-listed params after a turn, in the simulator's shape."""
    return {
        "remote_engine_id": "decode-5f6c8d9b7-x2k4q",
        "remote_request_id": "chatcmpl-0a1b2c3d4e5f-00ff",
        "remote_host": "10.0.3.17",
        "remote_port": 5600,
        "remote_block_ids": [list(ids) for _ in range(groups)],
        "remote_num_tokens": len(ids) * 16 - 7,
        "remote_blocks_expiry_time": 1234567.891011,
        "tp_size": 1,
        "dcp_size": 1,
        "pp_size": 1,
        "transfer_mode": "pull",
    }


def same(a: Any, b: Any) -> bool:
    """Serialized to the same bytes: True is not 1, 1.0 is not 1, key order counts, NaN is NaN."""
    return json.dumps(a) == json.dumps(b)


ids = st.integers(min_value=0, max_value=2**31 - 1)
any_int = st.one_of(ids, st.integers(min_value=-(2**70), max_value=2**70), st.sampled_from([2**31, 2**63, 2**64 - 1]))
json_scalar = st.one_of(
    st.none(),
    st.booleans(),
    any_int,
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.sampled_from(["\ud800", "é", ""]),
)
json_value = st.recursive(
    json_scalar,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=4)),
    max_leaves=12,
)
block_ids = st.one_of(
    st.lists(ids, max_size=300),  # flat
    st.lists(st.lists(ids, max_size=200), max_size=4),  # per KV-cache group, empty groups included
    st.lists(
        st.lists(st.one_of(ids, st.sampled_from([2**31 - 1, 2**31, 2**32, 2**63, 2**64 - 1])), max_size=20), max_size=3
    ),  # at and beyond what int32 deltas hold
    st.lists(st.lists(any_int, max_size=20), max_size=3),  # negative and huge ids
    st.lists(st.one_of(any_int, st.booleans(), st.floats(), st.lists(ids, max_size=3)), max_size=20),  # odd shapes
    json_value,
)


@st.composite
def params(draw) -> dict[str, Any]:
    """Params in any key order, with extra keys, any block-id shape and any subset of the keys."""
    base = decode_reply([])
    base["remote_block_ids"] = draw(block_ids)
    extra = draw(st.dictionaries(st.text(max_size=10), json_value, max_size=4))
    items = list(base.items()) + list(extra.items())
    items = [items[i] for i in draw(st.permutations(range(len(items))))]
    kept = draw(st.lists(st.booleans(), min_size=len(items), max_size=len(items)))
    return dict(item for item, keep in zip(items, kept, strict=True) if keep)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(params())
def test_compact_params_round_trip(p):
    back = unpack_params(pack_params(p))
    assert same(back, p) and list(back) == list(p)
    assert same(protocol.replay_params(back), protocol.replay_params(p))


@settings(max_examples=100, deadline=None)
@given(
    st.lists(ids, min_size=1, max_size=4096),
    st.integers(1, 3),
    st.text(max_size=20),
    st.one_of(st.none(), st.floats(allow_nan=False)),
)
def test_entries_round_trip_through_redis_bytes(block_ids, groups, url, expires_at):
    e = Entry(
        url,
        params=decode_reply(block_ids, groups),
        covered=Covered("text", "d" * 64, len(url)),
        scope="s" * 64,
        expires_at=expires_at or 0.0,
    )
    back = Entry.from_bytes(e.to_bytes())
    assert back == e and same(back.params, decode_reply(block_ids, groups))


def test_short_lists_and_small_payloads_take_the_light_path_and_long_ones_the_compact_one():
    short = decode_reply(list(range(100, 140)))
    blob = pack_params(short)
    assert blob[:1] == b"\x00" and same(unpack_params(blob), short)  # no zlib, no numpy
    rng = random.Random(5)
    for n in (47, 48, 49, 70, 300):  # around the numpy threshold; past 512 payload bytes (~57 ids here), zlib
        p = decode_reply(rng.sample(range(131072), n))
        blob = pack_params(p)
        assert blob[:1] == (b"\x00" if n < 50 else b"\x78"), n
        assert same(unpack_params(blob), p)


def test_a_long_history_packs_small():
    rng = random.Random(7)
    block_ids: list[int] = []
    while len(block_ids) < 2048:  # runs of consecutive ids, as a vLLM free queue hands them out
        start = rng.randrange(131072)
        block_ids += range(start, start + rng.randint(1, 24))
    p = decode_reply(block_ids[:2048])
    blob = pack_params(json.loads(json.dumps(p)))
    assert len(blob) < 1500 and same(unpack_params(blob), p)


async def test_stores_replay_long_histories_exactly(store):
    rng = random.Random(3)
    p = decode_reply(rng.sample(range(131072), 2048), groups=2)
    await store.put("k", Entry(D1, params=p, covered=Covered("messages", "abc", 3), scope="s"), ttl=60)
    got = await store.take("k")
    assert got is not None and same(got.params, p)


# ---- the byte bound ------------------------------------------------------------------------------------------------


async def test_memory_byte_bound_evicts_oldest_first():
    clock = Clock()
    cost = entry().nbytes
    s = MemoryStore(max_entries=1000, max_bytes=3 * cost, clock=clock)
    evicted = [await s.put(f"k{i}", entry(), ttl=10) for i in range(5)]
    assert evicted == [0, 0, 0, 1, 1]
    assert await s.size() == 3 and s.bytes_held() == 3 * cost
    assert await s.take("k0") is None and await s.take("k1") is None
    assert (await s.take("k2")).replayable and s.bytes_held() == 2 * cost
    assert sum(len(v) for v in s._by_endpoint.values()) == await s.size()


async def test_memory_bytes_follow_tombstones_replacements_and_expiry():
    clock = Clock()
    s = MemoryStore(max_entries=1000, clock=clock)
    await s.put("a", entry(D1), ttl=10)
    await s.put("b", entry(D2), ttl=10)
    await s.put("b", entry(D2, n=2), ttl=10)  # replaces, not adds
    assert s.bytes_held() == 2 * entry().nbytes
    assert await s.drop_endpoint(D1) == 1
    assert s.bytes_held() == ENTRY_OVERHEAD_BYTES + entry().nbytes
    assert s.health()["bytes"] == s.bytes_held()
    clock.now += 10 + EXPIRED_GRACE_SECONDS
    await s.sweep()
    assert await s.size() == 0 and s.bytes_held() == 0


async def test_memory_byte_bound_drops_an_entry_bigger_than_it():
    s = MemoryStore(max_entries=10, max_bytes=ENTRY_OVERHEAD_BYTES)
    await s.put("small", Entry(D1, reason="not_replayable"), ttl=10)
    assert await s.put("big", entry(), ttl=10) == 2
    assert await s.size() == 0 and s.bytes_held() == 0


async def test_expiry_is_not_counted_as_eviction():
    clock = Clock()
    s = MemoryStore(max_entries=2, clock=clock)
    await s.put("a", entry(), ttl=1)
    await s.put("b", entry(), ttl=1)
    clock.now += 1 + EXPIRED_GRACE_SECONDS
    assert await s.put("c", entry(), ttl=1) == 0 and await s.size() == 1


async def test_record_counts_evictions_and_bytes():
    from duplex_sidecars.router import pipeline
    from duplex_sidecars.router.apis.openai import CHAT
    from duplex_sidecars.router.config import RouterConfig
    from duplex_sidecars.router.endpoints import DECODE, Engine, Engines
    from duplex_sidecars.router.history import CHAT_ROUTE, History, Reply, scope_digest
    from duplex_sidecars.router.metrics import RouterMetrics
    from duplex_sidecars.router.turn import Turn

    def turn(key: str, messages: list[dict[str, Any]]) -> Turn:
        body = {"model": "m", "messages": messages}
        return Turn(
            api=CHAT,
            route=CHAT_ROUTE,
            path="/v1/chat/completions",
            body=body,
            model="m",
            stream=False,
            request_id="r",
            conversation_id=key,
            key=key,
            history=History.of_request(CHAT_ROUTE, body),
            scope=scope_digest(CHAT_ROUTE, body),
        )

    metrics = RouterMetrics()
    store = MemoryStore(max_entries=2)
    engines = Engines(metrics)
    engines.set_role(DECODE, [D1])
    deps = pipeline.Deps(RouterConfig(), engines, {}, store, None, metrics)  # type: ignore[arg-type]
    first = [{"role": "user", "content": "hi"}]
    reply = {"do_remote_decode": True, "do_remote_prefill": False, **decode_reply(list(range(1, 2049)))}
    reply["remote_host"] = "10.0.0.1"  # D1's side channel
    answer = Reply(content="hello", finish_reason="length")
    for key in ("a", "b", "c"):
        await pipeline.record(deps, turn(key, first), Engine(D1, DECODE), reply, answer)
    assert (
        metrics.registry.get_sample_value(
            "duplex_router_kv_captures_total", {"outcome": "stored", "stream": "false", "endpoint": D1}
        )
        == 3
    )
    assert metrics.registry.get_sample_value("duplex_router_store_dropped_entries_total") == 1
    assert metrics.registry.get_sample_value("duplex_router_store_bytes") == store.bytes_held() > 0

    follow_up = first + [{"role": "assistant", "content": "hello"}, {"role": "user", "content": "more"}]
    decision = await pipeline.lookup(deps, turn("c", follow_up))
    assert decision.reason is None and same(decision.params, protocol.replay_params(reply))
    assert metrics.registry.get_sample_value("duplex_router_store_bytes") == store.bytes_held()


async def test_memory_entries_are_not_walked_by_the_garbage_collector():
    s = MemoryStore(max_entries=10)
    await s.put("k", entry(), ttl=10)
    gc.collect()  # untracks tuples of atoms
    assert not gc.is_tracked(s._entries["k"])
    assert not any(gc.is_tracked(keys) for keys in s._by_endpoint.values())  # the keys held by each endpoint


async def test_memory_sweep_applies_lowered_bounds():
    clock = Clock()
    s = MemoryStore(max_entries=10, clock=clock)
    for i in range(6):
        await s.put(f"k{i}", entry(), ttl=10)
    s.max_entries = 4  # what a config reload does
    assert await s.sweep() == 2
    assert await s.size() == 4 and await s.take("k0") is None and await s.take("k2") is not None
    s.max_bytes = entry().nbytes
    assert await s.sweep() == 2  # k3 and k4 go, k5 stays
    assert await s.size() == 1 and s.bytes_held() == entry().nbytes


def _finishes_without_suspending(coro: Any) -> Any:
    """Run a coroutine one step: it must return at once (StopIteration), never wait on the event loop."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    coro.close()
    raise AssertionError("the coroutine suspended")


def test_memory_store_never_suspends_which_lets_the_router_answer_before_storing():
    # The router writes the client's last bytes and then stores the entry with nothing running in between; that is
    # only safe while put and take of an `immediate` store finish in one step, evictions included.
    s = MemoryStore(max_entries=2)
    assert s.immediate is True and RedisStore.immediate is False
    for i in range(4):
        _finishes_without_suspending(s.put(f"k{i}", entry(n=i), 60))
    assert _finishes_without_suspending(s.take("k3")).params["remote_num_tokens"] == 3
    assert _finishes_without_suspending(s.take("k0")) is None
    _finishes_without_suspending(s.drop_endpoint(D1))


def test_an_entry_keeps_its_prefill_engine_and_reads_entries_written_without_one():
    e = Entry(decode_url=D1, params={"remote_engine_id": "d", "remote_num_tokens": 3}, prefill_url="http://p1:8000")
    assert Entry.from_bytes(e.to_bytes()) == e
    assert Entry.from_row(e.to_row()).prefill_url == "http://p1:8000"
    assert e.tombstone("endpoint_gone").prefill_url == "http://p1:8000"
    # an entry a router of the previous release wrote to a shared Redis (seven metadata fields)
    from duplex_sidecars.router.store import _dump

    old = _dump([D1, None, None, None, None, None, 12.0])
    read = Entry.from_bytes(b"\x01" + len(old).to_bytes(4, "little") + old)
    assert read.decode_url == D1 and read.prefill_url is None and read.expires_at == 12.0

"""The Redis store with two `duplex router` processes sharing conversation state in front of simulator engines; and a
Redis outage, during which the routers keep serving by recomputing."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator

import pytest

from duplex_dev.chat import ChatClient, Conversation
from duplex_dev.launch.router import RouterProcess
from duplex_dev.launch.sim import SimProcess, sim_pair

pytestmark = pytest.mark.redis

LONG = "Describe the water cycle step by step, with examples from three continents. " * 8


@pytest.fixture(scope="module")
def engines() -> Iterator[tuple[SimProcess, SimProcess]]:
    with sim_pair(prefill_args=["--no-enable-prefix-caching"]) as pair:
        yield pair


@pytest.fixture
def routers(redis_server, engines) -> Iterator[tuple[RouterProcess, RouterProcess]]:
    prefill, decode = engines
    prefix = f"t{uuid.uuid4().hex[:8]}:"
    a = RouterProcess(
        prefill=[prefill.url],
        decode=[decode.url],
        config={"store": {"kind": "redis", "redis_url": redis_server.url, "key_prefix": prefix}},
    )
    b = RouterProcess(
        prefill=[prefill.url],
        decode=[decode.url],
        config={"store": {"kind": "redis", "redis_url_env": "DUPLEX_TEST_REDIS", "key_prefix": prefix}},
        env={"DUPLEX_TEST_REDIS": redis_server.url},
    )
    try:
        a.start(), b.start()
        a.wait_ready(), b.wait_ready()
        yield a, b
    finally:
        a.stop(), b.stop()


def external(prefill: SimProcess) -> float:
    return prefill.metric("vllm:prompt_tokens_by_source_total", source="external_kv_transfer")


def hits(r: RouterProcess) -> float:
    return r.metric("duplex_router_kv_reuse_hits_total")


def ready(r: RouterProcess) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(r.url + "/ready", timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


async def test_two_routers_share_conversation_state(routers, engines):
    a, b = routers
    prefill, _ = engines
    external0 = external(prefill)
    conv = Conversation("shared-" + uuid.uuid4().hex)
    async with ChatClient(a.url) as via_a, ChatClient(b.url) as via_b:
        await via_a.turn(conv, LONG)
        await via_b.turn(conv, "next, please", stream=True)
        await via_a.turn(conv, "and the last part")
    assert hits(a) == 1 and hits(b) == 1
    reused = a.metric("duplex_router_kv_reused_tokens_total") + b.metric("duplex_router_kv_reused_tokens_total")
    assert external(prefill) - external0 == reused > 0
    assert prefill.metric("sim_corrupt_blocks_total") == 0
    status, body = ready(a)
    assert status == 200 and body["store"]["kind"] == "redis" and body["store"]["healthy"] is True


async def test_entries_are_single_use_across_routers(routers):
    a, b = routers
    conv = Conversation("race-" + uuid.uuid4().hex)
    async with ChatClient(a.url) as via_a, ChatClient(b.url) as via_b:
        await via_a.turn(conv, LONG)
        nxt = conv.messages + [{"role": "user", "content": "go on"}]
        results = await asyncio.gather(*(c.send(nxt, conv.conversation_id) for c in (via_a, via_b) * 3))
    assert len({r.text for r in results}) == 1
    assert hits(a) + hits(b) == 1


async def test_redis_outage_keeps_serving_by_recomputing(routers, redis_server, engines):
    a, _ = routers
    prefill, _ = engines
    conv = Conversation("outage-" + uuid.uuid4().hex)
    redis_server.stop()
    try:
        external0 = external(prefill)
        async with ChatClient(a.url) as client:
            t = time.perf_counter()
            for _ in range(3):
                await client.turn(conv, LONG)
            assert time.perf_counter() - t < 10
        assert external(prefill) == external0
        assert a.metric("duplex_router_kv_reuse_misses_total", reason="store_error") >= 1
        assert a.metric("duplex_router_store_errors_total") >= 1
        status, body = ready(a)
        assert status == 200, "a store outage must not take the router out of rotation"
        assert body["store"]["healthy"] is False and body["store"]["errors"] >= 1
    finally:
        redis_server.start()
    await asyncio.sleep(1.2)  # past the router's error backoff
    fresh = Conversation("after-" + uuid.uuid4().hex)
    async with ChatClient(a.url) as client:
        await client.turn(fresh, LONG)
        await client.turn(fresh, "again")
    assert hits(a) == 1
    assert ready(a)[1]["store"]["healthy"] is True

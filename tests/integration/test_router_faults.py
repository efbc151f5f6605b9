"""Fault injection with real simulator engines: engines dying mid-stream or before answering, failed KV loads on
prefill, slow engines. The client always gets either a correct answer or a clean, OpenAI-shaped error."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from duplex_dev.chat import ChatClient, Conversation, sse_events
from duplex_dev.launch.sim import SimProcess
from duplex_sidecars.router.app import Router, RouterServer
from duplex_sidecars.router.config import RouterConfig
from duplex_sidecars.router.config_file import deep_merge
from duplex_sidecars.sim import generation
from duplex_sidecars.sim.chat_template import render_chat

LONG = "Tell me everything about the history of the printing press. " * 10
QUIET_PROBES = {"health_check": {"interval_seconds": 60, "timeout_seconds": 1}}


def expected_reply(messages: list[dict[str, Any]], max_tokens: int | None = None) -> str:
    return generation.chat_text(generation.reply(render_chat(messages), max_tokens).tokens)


class Running:
    def __init__(self) -> None:
        self.sims: list[SimProcess] = []
        self.servers: list[RouterServer] = []
        self.clients: list[ChatClient] = []

    async def sims_up(self, *sims: SimProcess) -> list[SimProcess]:
        for sim in sims:
            self.sims.append(sim)
            sim.start()
        await asyncio.gather(*(s.wait_ready_async() for s in sims))
        return list(sims)

    async def router(self, prefill: list[SimProcess], decode: list[SimProcess], **config: Any):
        base = {"prefill": [p.url for p in prefill], "decode": [d.url for d in decode]}
        router = Router(RouterConfig.model_validate(deep_merge(deep_merge(base, QUIET_PROBES), config)))
        server = RouterServer(router)
        await server.start()
        self.servers.append(server)
        client = await ChatClient(server.url, model="sim").__aenter__()
        self.clients.append(client)
        return router, client


@pytest.fixture
async def running() -> AsyncIterator[Running]:
    r = Running()
    yield r
    for client in r.clients:
        await client.__aexit__()
    for server in r.servers:
        await server.close()
    await asyncio.gather(*(asyncio.to_thread(s.stop) for s in r.sims))


def metric(router: Router, name: str, **labels: str) -> float:
    return router.metrics.total(name, **labels)


async def test_decode_killed_mid_stream_ends_the_stream_cleanly(running):
    p, d = await running.sims_up(SimProcess("prefill"), SimProcess("decode", "--decode-us-per-token", "30000"))
    router, client = await running.router([p], [d])
    body = {
        "model": "sim",
        "messages": [{"role": "user", "content": LONG}],
        "stream": True,
        "max_tokens": 60,
        "conversation_id": "mid-stream",
    }
    raw = bytearray()
    async with client._session.post(client.base + "/v1/chat/completions", json=body) as resp:
        assert resp.status == 200
        killed = False
        async for chunk in resp.content.iter_any():
            raw += chunk
            if not killed and raw.count(b"\n\n") >= 3:
                os.kill(d.process.pid, signal.SIGKILL)  # the decode engine dies while streaming
                killed = True
    events = sse_events(bytes(raw))
    assert killed and events[-1] == "[DONE]"
    error = events[-2]["error"]
    assert error["code"] == 502 and set(error) == {"message", "type", "code"}
    assert all("kv_transfer_params" not in json.dumps(e) for e in events)
    assert metric(router, "duplex_router_kv_captures_total", outcome="stored") == 0
    # with its only decode engine gone the router answers 503 with a clear message, not a hang or a crash
    async with client._session.post(client.base + "/v1/chat/completions", json={**body, "stream": False}) as resp:
        assert resp.status == 503
        assert (await resp.json())["error"]["message"] == "No decode engine could be reached."


async def test_decode_failing_before_the_first_byte_retries_with_a_fresh_prefill(running):
    p, small, ok = await running.sims_up(
        SimProcess("prefill"), SimProcess("decode", "--num-blocks", "4"), SimProcess("decode")
    )
    router, client = await running.router([p], [small, ok])
    router.engines.decode.engines[ok.url].healthy = None  # so the first pick is the engine that cannot fit it
    messages = [{"role": "user", "content": LONG}]
    for stream in (True, False):
        router.engines.decode.engines[ok.url].healthy = None
        result = await client.send(messages, None, stream=stream)
        assert result.text == expected_reply(messages)
    assert metric(router, "duplex_router_retries_total", leg="decode") == 2
    assert metric(router, "duplex_router_backend_errors_total", leg="decode", kind="status_5xx") == 2
    assert p.metric("vllm:request_success_total") == 4  # each try ran its own prefill leg


async def test_failed_kv_load_on_prefill_is_retried_without_reuse(running):
    """Decode restarts between turns (same address, blocks gone): prefill's read of the stored blocks fails with
    kv_load_failure_policy=fail (HTTP 500); the router retries without replay and the turn is recomputed."""
    p, d = await running.sims_up(SimProcess("prefill", "--no-enable-prefix-caching"), SimProcess("decode"))
    router, client = await running.router([p], [d])
    conv = Conversation("restart-" + uuid.uuid4().hex)
    await client.turn(conv, LONG)
    await asyncio.to_thread(d.stop)
    fresh = SimProcess("decode", port=d.port, side_channel_port=d.side_channel_port)
    await running.sims_up(fresh)
    history = conv.messages + [{"role": "user", "content": "and after that?"}]
    result = await client.turn(conv, "and after that?")
    assert result.text == expected_reply(history)
    assert metric(router, "duplex_router_kv_reuse_misses_total", reason="prefill_retry") == 1
    assert metric(router, "duplex_router_retries_total", leg="prefill") == 1
    assert metric(router, "duplex_router_kv_reuse_hits_total") == 0
    assert p.metric("vllm:nixl_num_failed_transfers_total") >= 1
    assert p.metric("sim_corrupt_blocks_total") == 0
    # the next turn reuses the restarted engine's blocks again
    await client.turn(conv, "one more")
    assert metric(router, "duplex_router_kv_reuse_hits_total") == 1


async def test_dead_prefill_engine_is_retried_on_another(running):
    p1, p2, d = await running.sims_up(SimProcess("prefill"), SimProcess("prefill"), SimProcess("decode"))
    router, client = await running.router([p1, p2], [d])
    await asyncio.to_thread(p1.stop)
    messages = [{"role": "user", "content": LONG}]
    results = await asyncio.gather(*(client.send(messages) for _ in range(6)))
    assert {r.text for r in results} == {expected_reply(messages)}
    assert router.engines.prefill.engines[p1.url].healthy is False
    assert metric(router, "duplex_router_retries_total", leg="prefill") >= 1


async def test_all_prefill_engines_down_is_a_503(running):
    p, d = await running.sims_up(SimProcess("prefill"), SimProcess("decode"))
    router, client = await running.router([p], [d])
    await asyncio.to_thread(p.stop)
    async with client._session.post(
        client.base + "/v1/chat/completions", json={"model": "sim", "messages": [{"role": "user", "content": "hi"}]}
    ) as resp:
        assert resp.status == 503
        assert "prefill" in (await resp.json())["error"]["message"]
    await router.prober.probe_all()
    async with client._session.get(client.base + "/ready") as resp:
        assert resp.status == 503 and (await resp.json())["prefill"]["healthy"] == 0


async def test_slow_prefill_times_out_with_a_504(running):
    p, d = await running.sims_up(SimProcess("prefill", "--prefill-us-per-token", "20000"), SimProcess("decode"))
    router, client = await running.router([p], [d], timeouts={"prefill_seconds": 0.3})
    async with client._session.post(
        client.base + "/v1/chat/completions", json={"model": "sim", "messages": [{"role": "user", "content": LONG}]}
    ) as resp:
        assert resp.status == 504
        body = await resp.json()
        assert body["error"]["type"] == "timeout" and "prefill" in body["error"]["message"]
    assert metric(router, "duplex_router_retries_total", leg="prefill") == 0  # a timeout is not retried


async def test_client_disconnect_mid_stream_aborts_the_decode_request(running):
    p, d = await running.sims_up(SimProcess("prefill"), SimProcess("decode", "--decode-us-per-token", "20000"))
    router, client = await running.router([p], [d])
    async with aiohttp.ClientSession() as session:
        resp = await session.post(
            client.base + "/v1/chat/completions",
            json={
                "model": "sim",
                "messages": [{"role": "user", "content": LONG}],
                "stream": True,
                "max_tokens": 200,
                "conversation_id": "walks-away",
            },
        )
        await resp.content.readany()
        resp.close()  # the client walks away
    for _ in range(100):
        if d.metric("vllm:num_requests_running") == 0:
            break
        await asyncio.sleep(0.05)
    assert d.metric("vllm:num_requests_running") == 0
    assert metric(router, "duplex_router_kv_captures_total", outcome="stored") == 0
    assert all(e.inflight == 0 for e in router.engines.decode.engines.values())
    result = await client.send([{"role": "user", "content": "still serving?"}])
    assert result.text

"""Malformed, oversized and misdirected requests get OpenAI-style 4xx errors and never reach an engine."""

from __future__ import annotations

import asyncio
import gc
import json

import pytest

USER = {"role": "user", "content": "hi"}


def assert_openai_error(body, status: int) -> None:
    assert set(body) == {"error"}, body
    assert set(body["error"]) == {"message", "type", "code"}
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]


@pytest.mark.parametrize(
    "data, status, code",
    [
        (b"{not json", 400, "invalid_json"),
        (b"\xff\xfe", 400, "invalid_json"),
        (b"[1, 2]", 400, "invalid_body"),
        (b'"text"', 400, "invalid_body"),
        (json.dumps({"messages": [USER]}).encode(), 400, "missing_model"),
        (json.dumps({"model": 3, "messages": [USER]}).encode(), 400, "missing_model"),
        (json.dumps({"model": "m"}).encode(), 400, "invalid_messages"),
        (json.dumps({"model": "m", "messages": []}).encode(), 400, "invalid_messages"),
        (json.dumps({"model": "m", "messages": "hi"}).encode(), 400, "invalid_messages"),
        (json.dumps({"model": "m", "messages": ["hi"]}).encode(), 400, "invalid_messages"),
        (json.dumps({"model": "m", "messages": [USER], "stream": "yes"}).encode(), 400, "invalid_type"),
        (json.dumps({"model": "m", "messages": [USER], "max_tokens": "10"}).encode(), 400, "invalid_type"),
        (json.dumps({"model": "m", "messages": [USER], "conversation_id": 5}).encode(), 400, "invalid_type"),
        (json.dumps({"model": "m", "messages": [USER], "conversation_id": "x" * 5000}).encode(), 400, "invalid_value"),
    ],
)
async def test_chat_rejects(make_rig, data, status, code):
    rig = await make_rig()
    got, body, _ = await rig.post("/v1/chat/completions", data=data, headers={"Content-Type": "application/json"})
    assert got == status
    assert_openai_error(body, status)
    assert body["error"]["code"] == code
    assert rig.p.seen == [] and rig.d.seen == []
    assert rig.metric("duplex_router_requests_total", route="chat", status=str(status)) == 1


async def test_completions_need_a_prompt(make_rig):
    rig = await make_rig()
    status, body, _ = await rig.post("/v1/completions", {"model": "m"})
    assert status == 400 and body["error"]["code"] == "missing_prompt"


async def test_oversized_bodies_are_413(make_rig):
    rig = await make_rig(max_body_bytes=1000)
    big = {"model": "m", "messages": [{"role": "user", "content": "x" * 2000}]}
    status, body, _ = await rig.post("/v1/chat/completions", big)
    assert status == 413
    assert_openai_error(body, 413)

    async def chunks():
        for _ in range(10):
            yield b"x" * 200

    async with rig.session.post(rig.url + "/v1/chat/completions", data=chunks()) as resp:  # no Content-Length
        assert resp.status == 413
        assert_openai_error(await resp.json(), 413)
    assert rig.p.seen == []


@pytest.mark.parametrize(
    "method, path, status",
    [
        ("GET", "/nope", 404),
        ("POST", "/v1/embeddings", 404),
        ("GET", "/v1/chat/completions", 405),
        ("DELETE", "/health", 405),
    ],
)
async def test_unknown_routes(make_rig, method, path, status):
    rig = await make_rig()
    async with rig.session.request(method, rig.url + path) as resp:
        assert resp.status == status
        assert_openai_error(await resp.json(), status)


async def test_no_engines_configured_is_503(make_rig):
    rig = await make_rig(n_prefill=0, n_decode=0)
    status, body, _ = await rig.post("/v1/chat/completions", {"model": "m", "messages": [USER]})
    assert status == 503
    assert_openai_error(body, 503)
    async with rig.session.get(rig.url + "/ready") as resp:
        assert resp.status == 503


async def test_a_flood_of_bad_requests_leaves_nothing_behind(make_rig):
    rig = await make_rig(max_body_bytes=4096)
    bad = [
        b"{",
        b"[]",
        json.dumps({"model": "m"}).encode(),
        b"x" * 5000,
        json.dumps({"model": "m", "messages": [USER], "conversation_id": 1}).encode(),
    ]

    async def one(i: int) -> int:
        async with rig.session.post(rig.url + "/v1/chat/completions", data=bad[i % len(bad)]) as resp:
            await resp.read()
            return resp.status

    statuses = []
    for start in range(0, 600, 100):
        statuses += await asyncio.gather(*(one(i) for i in range(start, start + 100)))
    assert set(statuses) <= {400, 413}
    gc.collect()
    assert await rig.router.store.size() == 0
    assert all(e.inflight == 0 for e in rig.router.engines.prefill.engines.values())
    status, _, _ = await rig.chat([USER])
    assert status == 200


async def test_a_flood_of_broken_http_leaves_no_connection_or_task_behind(make_rig):
    # Garbage, heads too large, upgrades, bodies over the limit, clients that vanish mid-request or mid-body: each
    # connection is answered or cut, and the server holds nothing once its clients are gone.
    rig = await make_rig(max_body_bytes=4096)
    host, port = rig.url.removeprefix("http://").split(":")
    body = json.dumps({"model": "m", "messages": [USER]}).encode()
    sends = [
        b"NOT HTTP AT ALL\r\n\r\n",
        b"GET /" + b"a" * 70000 + b" HTTP/1.1\r\n\r\n",
        b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n",
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 999999\r\n\r\n" + b"x" * 5000,
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{",  # vanishes mid-body
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Le",  # vanishes mid-head
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body),
    ]

    async def one(i: int) -> bytes:
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(sends[i % len(sends)])
        try:
            if i % len(sends) in (4, 5):
                return b""  # leaves without waiting
            return await asyncio.wait_for(reader.read(200), 30)
        finally:
            writer.close()

    for start in range(0, 700, 70):
        answers = await asyncio.gather(*(one(i) for i in range(start, start + 70)))
        for i, answer in enumerate(answers, start):
            kind = i % len(sends)
            if kind in (0, 1, 2, 3, 6):
                expected = {0: b"400", 1: b"431", 2: b"200", 3: b"413", 6: b"200"}[kind]
                assert answer.startswith(b"HTTP/1.1 " + expected), (kind, answer[:60])
    front = rig.server.server.api
    assert front is not None
    for _ in range(500):
        if not front._conns and not front._tasks:
            break
        await asyncio.sleep(0.02)
    assert not front._conns and not front._tasks
    assert all(e.inflight == 0 for e in rig.router.engines.prefill.engines.values())


@pytest.mark.parametrize(
    "headers",
    [b"Authorization: Bearer alice\r\nAuthorization: Bearer bob", b"X-Conversation-Id: c1\r\nx-conversation-id: c2"],
    ids=["two tenants", "two conversations"],
)
async def test_a_request_naming_two_tenants_or_conversations_is_400(make_rig, headers):
    # Joined, two values would name a third tenant or conversation: refused instead, before any engine sees it.
    # (Raw bytes: aiohttp's client sends only one of two same-named headers.)
    rig = await make_rig()
    host, port = rig.url.removeprefix("http://").split(":")
    body = json.dumps({"model": "m", "messages": [USER]}).encode()
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nContent-Type: application/json\r\n%s\r\n"
        b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (headers, len(body), body)
    )
    raw = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    head, _, payload = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 ")
    out = json.loads(payload)
    assert_openai_error(out, 400)
    assert out["error"]["code"] == "duplicate_header"
    assert rig.p.seen == [] and rig.d.seen == []


async def test_the_inflight_cap_is_counted_and_applies_on_reload(make_rig):
    rig = await make_rig(client_limits={"max_inflight_requests": 1})
    rig.d.actions = ["hang"]
    stuck = asyncio.create_task(rig.chat([USER], conv=None))
    await asyncio.sleep(0.3)
    status, body, _ = await rig.chat([USER], conv=None)
    assert status == 503 and body["error"]["code"] == 503
    assert rig.metric("duplex_router_rejected_requests_total", reason="inflight") == 1
    async with rig.session.get(rig.url + "/ready") as resp:
        assert resp.status == 200  # readiness is not counted against the cap
    config = rig.router.config.model_copy(deep=True)
    config.client_limits.max_inflight_requests = 2
    await rig.router.apply(config)
    status, _, _ = await rig.chat([USER], conv=None)
    assert status == 200
    stuck.cancel()

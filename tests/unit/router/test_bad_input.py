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
        (json.dumps({"model": "m", "messages": [USER], "conversation_id": "x" * 5000}).encode(), 400,
         "invalid_value"),
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


@pytest.mark.parametrize("method, path, status", [
    ("GET", "/nope", 404), ("POST", "/v1/embeddings", 404), ("GET", "/v1/chat/completions", 405),
    ("DELETE", "/health", 405),
])
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
    bad = [b"{", b"[]", json.dumps({"model": "m"}).encode(), b"x" * 5000,
           json.dumps({"model": "m", "messages": [USER], "conversation_id": 1}).encode()]

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

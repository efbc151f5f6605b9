"""The router on /v1/responses and /v1/messages, in front of real `duplex sim` engines that move KV over NIXL and
serve both routes as vLLM 0.33 does.

A client that resends its history the way each API's SDK does (Responses: the previous input, then the previous
response's `output` items, then new items; Messages: the previous messages, then the assistant message with the
content blocks it got back) has decode's KV read back on its follow-up turns, with or without a conversation id;
nothing engine-internal reaches it on either route, streaming or not; errors keep each API's own shape.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import pytest

from duplex_dev.launch.sim import SimProcess
from duplex_sidecars.router.app import Router, RouterServer
from duplex_sidecars.router.config import RouterConfig
from duplex_sidecars.sim.nixl_transport import NixlUnavailable, load_nixl_api

pytestmark = [pytest.mark.nixl, pytest.mark.timeout(180)]

EXTERNAL = "vllm:prompt_tokens_by_source_total"
LONG = "Please read the attached report carefully and summarise every section of it in detail. " * 8
SYSTEM = "You are a coding agent working in a large repository."


@pytest.fixture(scope="module")
def engines() -> Iterator[tuple[SimProcess, SimProcess]]:
    try:
        load_nixl_api()
    except NixlUnavailable as e:
        pytest.fail(f"nixl is required for the NIXL tier (CI and local): {e}")
    prefill = SimProcess(
        "prefill",
        "--no-enable-prefix-caching",
        "--kv-load-failure-policy",
        "recompute",
        "--fail-on-corrupt",
        startup_timeout=90,
    )
    decode = SimProcess("decode", "--fail-on-corrupt", startup_timeout=90)
    try:
        prefill.start(), decode.start()
        prefill.wait_ready(), decode.wait_ready()
        yield prefill, decode
    finally:
        prefill.stop(), decode.stop()


class Rig:
    def __init__(self, router: Router, url: str, session: aiohttp.ClientSession, prefill: SimProcess):
        self.router, self.url, self.session, self.prefill = router, url, session, prefill

    def metric(self, name: str, **labels: str) -> float:
        return self.router.metrics.total(name, **labels)

    def read_back(self) -> float:
        return self.prefill.metric(EXTERNAL, source="external_kv_transfer")

    async def post(
        self, path: str, body: dict[str, Any], headers: dict[str, str] | None = None
    ) -> tuple[int, Any, bytes]:
        async with self.session.post(self.url + path, json=body, headers=headers or {}) as resp:
            raw = await resp.read()
            if "event-stream" in resp.headers.get("Content-Type", ""):
                return resp.status, events(raw), raw
            return resp.status, json.loads(raw), raw


def events(raw: bytes) -> list[tuple[str | None, Any]]:
    out = []
    for frame in raw.decode().split("\n\n"):
        name, data = None, None
        for line in frame.splitlines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data = json.loads(line[6:])
        if data is not None:
            out.append((name, data))
    return out


def no_engine_internals(raw: bytes) -> None:
    for word in (b"kv_transfer_params", b"remote_block_ids", b"remote_engine_id", b"remote_host"):
        assert word not in raw, word


@pytest.fixture
async def rig(engines) -> AsyncIterator[Rig]:
    prefill, decode = engines
    router = Router(RouterConfig.model_validate({"prefill": [prefill.url], "decode": [decode.url]}))
    server = await RouterServer(router).start()
    async with aiohttp.ClientSession() as session:
        yield Rig(router, server.url, session, prefill)
    await server.close()


# -- Responses ----------------------------------------------------------------------------------------------------


def responses_body(items: list[dict[str, Any]] | str, **extra: Any) -> dict[str, Any]:
    return {"model": "sim", "instructions": SYSTEM, "input": items, "max_output_tokens": 24, **extra}


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("with_id", [True, False])
async def test_responses_follow_ups_read_decodes_kv_back(rig, stream, with_id):
    extra: dict[str, Any] = {"conversation_id": f"r-{uuid.uuid4().hex}"} if with_id else {}
    items: list[dict[str, Any]] = [{"role": "user", "content": LONG + uuid.uuid4().hex}]
    read0 = rig.read_back()
    for turn in range(3):
        status, out, raw = await rig.post("/v1/responses", responses_body(items, stream=stream, **extra))
        assert status == 200, out
        no_engine_internals(raw)
        terminal = ("response.completed", "response.incomplete")
        response = next(d["response"] for name, d in out if name in terminal) if stream else out
        assert response["status"] in ("completed", "incomplete")
        # the Responses SDK pattern: input += response.output, then the next message
        items = items + response["output"] + [{"role": "user", "content": f"Now section {turn + 2}, please."}]
    assert rig.metric("duplex_router_kv_reuse_hits_total") == 2
    assert rig.read_back() - read0 == rig.metric("duplex_router_kv_reused_tokens_total") > 0


async def test_responses_previous_response_id_is_refused_with_how_to_send_the_input(rig):
    status, out, _ = await rig.post("/v1/responses", responses_body("hi", previous_response_id="resp_1"))
    assert status == 400
    assert out["error"]["code"] == "unsupported_parameter"
    assert "Send the whole conversation as 'input'" in out["error"]["message"]


async def test_responses_with_an_edited_output_item_is_not_replayed(rig):
    items: list[dict[str, Any]] = [{"role": "user", "content": LONG + uuid.uuid4().hex}]
    _, response, _ = await rig.post("/v1/responses", responses_body(items))
    edited = [dict(response["output"][0], content=[{"type": "output_text", "text": "something else"}])]
    await rig.post("/v1/responses", responses_body(items + edited + [{"role": "user", "content": "go on"}]))
    assert rig.metric("duplex_router_kv_reuse_hits_total") == 0
    assert rig.metric("duplex_router_kv_reuse_misses_total", reason="no_entry") >= 1


# -- Messages -----------------------------------------------------------------------------------------------------


def messages_body(messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"model": "sim", "system": SYSTEM, "messages": messages, "max_tokens": 24, **extra}


@pytest.mark.parametrize("with_id", [True, False])
async def test_messages_follow_ups_read_decodes_kv_back(rig, with_id):
    headers = {"x-api-key": "key-a", **({"X-Conversation-Id": f"m-{uuid.uuid4().hex}"} if with_id else {})}
    messages: list[dict[str, Any]] = [{"role": "user", "content": LONG + uuid.uuid4().hex}]
    read0 = rig.read_back()
    for turn in range(3):
        status, out, raw = await rig.post("/v1/messages", messages_body(messages), headers)
        assert status == 200, out
        no_engine_internals(raw)
        assert out["type"] == "message" and out["role"] == "assistant"
        # the Anthropic SDK pattern: the assistant message with the content blocks as returned
        messages = messages + [{"role": "assistant", "content": out["content"]}]
        messages.append({"role": "user", "content": [{"type": "text", "text": f"And part {turn + 2}?"}]})
    assert rig.metric("duplex_router_kv_reuse_hits_total") == 2
    assert rig.read_back() - read0 == rig.metric("duplex_router_kv_reused_tokens_total") > 0


async def test_a_streamed_messages_turn_leaves_nothing_to_replay_and_says_why(rig):
    # vLLM 0.33's Anthropic stream carries no kv_transfer_params: the next turn's miss names the cause.
    messages: list[dict[str, Any]] = [{"role": "user", "content": LONG + uuid.uuid4().hex}]
    status, out, raw = await rig.post("/v1/messages", messages_body(messages, stream=True))
    assert status == 200
    no_engine_internals(raw)
    names = [name for name, _ in out]
    assert names[0] == "message_start" and names[-1] == "message_stop"
    text = "".join(d["delta"].get("text", "") for name, d in out if name == "content_block_delta")
    follow_up = messages + [
        {"role": "assistant", "content": [{"type": "text", "text": text}]},
        {"role": "user", "content": "Go on."},
    ]
    status, _, _ = await rig.post("/v1/messages", messages_body(follow_up))
    assert status == 200
    assert rig.metric("duplex_router_kv_reuse_misses_total", reason="stream_no_params") == 1
    assert rig.metric("duplex_router_kv_captures_total", outcome="no_params", stream="true") == 1


async def test_messages_errors_keep_anthropics_shape(rig):
    status, out, _ = await rig.post("/v1/messages", {"model": "sim", "messages": [{"role": "user", "content": "x"}]})
    assert status == 400
    assert out["type"] == "error" and out["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in out["error"]["message"]


async def test_messages_tenants_are_kept_apart_by_their_api_key(rig):
    messages: list[dict[str, Any]] = [{"role": "user", "content": LONG + uuid.uuid4().hex}]
    _, out, _ = await rig.post("/v1/messages", messages_body(messages), {"x-api-key": "alice"})
    follow_up = messages + [{"role": "assistant", "content": out["content"]}, {"role": "user", "content": "Go on."}]
    await rig.post("/v1/messages", messages_body(follow_up), {"x-api-key": "bob"})
    assert rig.metric("duplex_router_kv_reuse_hits_total") == 0
    await rig.post("/v1/messages", messages_body(follow_up), {"x-api-key": "alice"})
    assert rig.metric("duplex_router_kv_reuse_hits_total") == 1

"""Nothing engine-internal reaches a client through the router, streaming or not: no kv_transfer_params, no remote_*
field, no engine id, no side-channel address, whatever real vLLM put in its answers to the router."""

from __future__ import annotations

import re
import uuid
from typing import Any

import pytest

from duplex_sidecars.protocol import miss_params

from .rig import LONG, chat_body, completion_body, post


@pytest.fixture(scope="module")
def internals(engines) -> list[bytes]:
    """What an engine-internal leak would contain: the field names, and the engines' own ids and side channels, as
    vLLM reports them when the P-D protocol is run by hand."""
    prompt = [{"role": "user", "content": LONG}]
    prefill = post(engines.prefill.url + "/v1/chat/completions", chat_body(prompt, 1, kv_transfer_params=miss_params()))
    p = prefill.body["kv_transfer_params"]
    decode = post(engines.decode.url + "/v1/chat/completions", chat_body(prompt, 4, kv_transfer_params=p))
    d = decode.body["kv_transfer_params"]
    assert p["remote_engine_id"] != d["remote_engine_id"]
    words: list[Any] = ["kv_transfer_params", "remote_", "do_remote", "transfer_mode", "tp_size"]
    words += [p["remote_engine_id"], d["remote_engine_id"], p["remote_request_id"], d["remote_request_id"]]
    words += [f"{p['remote_host']}:{p['remote_port']}", f"{d['remote_host']}:{d['remote_port']}"]
    return [str(w).encode() for w in words]


def _assert_clean(raw: bytes, headers: dict[str, str], internals: list[bytes], engines) -> None:
    for word in internals:
        assert word not in raw, f"{word!r} reached the client: {raw[:3000]!r}"
    for engine in engines.all():
        # neither the engines' HTTP addresses nor their side-channel ports show in headers
        # (as a number of its own: a receipt's durations and token counts are numbers too)
        port = re.compile(rf"(?<![\d.]){engine.side_channel_port}(?![\d.])")
        for value in headers.values():
            assert engine.url not in value and not port.search(value), headers


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("route", ["chat", "completions"])
def test_no_engine_internals_reach_the_client(engines, router, internals, stream, route):
    conv = f"leak-{route}-{stream}-{uuid.uuid4().hex}"
    if route == "chat":
        path, body = "/v1/chat/completions", chat_body([{"role": "user", "content": LONG}], 8)
    else:
        path, body = "/v1/completions", completion_body(LONG, 8)
    body |= {"conversation_id": conv, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    for turn in range(2):  # the second turn is a hit for the non-streaming case: replayed params must not leak either
        resp = post(router.url + path, body)
        assert resp.status == 200, resp.raw
        _assert_clean(resp.raw, resp.headers, internals, engines)
        # the receipt: where the time went and the verdict (no reason: these clients are the anonymous tenant)
        verdict = re.search(r'kv;desc="(hit:\d+|miss)"$', resp.headers.get("Server-Timing", ""))
        assert verdict, resp.headers
        if turn == 1 and not stream:
            assert verdict.group(1).startswith("hit:"), resp.headers
        if stream:
            assert resp.events[-1] == "[DONE]"
            assert all("error" not in e for e in resp.events if isinstance(e, dict))
            text = "".join(
                (c.get("delta") or {}).get("content") or c.get("text") or ""
                for e in resp.events
                if isinstance(e, dict)
                for c in e["choices"]
            )
        else:
            choice = resp.body["choices"][0]
            text = choice["message"]["content"] if route == "chat" else choice["text"]
        if route == "chat":
            body["messages"] = body["messages"] + [
                {"role": "assistant", "content": text},
                {"role": "user", "content": "Go on."},
            ]
        else:
            body["prompt"] = body["prompt"] + text + " Then"


def test_engine_errors_reach_the_client_in_openai_shape(engines, router, internals):
    too_long = post(router.url + "/v1/chat/completions", chat_body([{"role": "user", "content": "word " * 9000}], 4))
    assert too_long.status == 400
    assert set(too_long.body["error"]) >= {"message", "type", "code"}
    _assert_clean(too_long.raw, too_long.headers, internals, engines)
    unknown = post(
        router.url + "/v1/chat/completions", {**chat_body([{"role": "user", "content": "hi"}]), "model": "x"}
    )
    assert unknown.status == 404, unknown.raw
    _assert_clean(unknown.raw, unknown.headers, internals, engines)

"""Agentic clients as they are, on real vLLM CPU engines behind the router: a plain OpenAI SDK client that sends no
conversation id, a Responses API client and an Anthropic Messages client each have decode's KV read back over
NIXL on their follow-up turns (vLLM's own counters), and nothing engine-internal reaches them."""

from __future__ import annotations

import uuid
from typing import Any

from .rig import LONG, Counters, assert_follow_ups_reused, chat, post, served_model

INTERNALS = (b"kv_transfer_params", b"remote_block_ids", b"remote_engine_id", b"remote_host")


def no_internals(raw: bytes) -> None:
    for word in INTERNALS:
        assert word not in raw, word


def test_a_plain_openai_client_without_an_id_gets_reuse(engines, router):
    # No conversation_id, no header: the router finds decode's blocks by the digest of the history.
    messages: list[dict[str, Any]] = [{"role": "user", "content": LONG + uuid.uuid4().hex}]
    before = Counters.read(engines.prefill, router)
    for turn in range(3):
        answer = chat(router.url, messages)
        no_internals(answer.raw)
        messages += [{"role": "assistant", "content": answer.text}, {"role": "user", "content": f"More, {turn}."}]
    delta = Counters.read(engines.prefill, router) - before
    assert_follow_ups_reused(delta, 2)
    assert delta.misses.get("no_prior_turn") == 1


def test_a_responses_client_gets_reuse(engines, router):
    items: list[dict[str, Any]] = [{"role": "user", "content": LONG + uuid.uuid4().hex}]
    before = Counters.read(engines.prefill, router)
    for turn in range(3):
        body = {"model": served_model(), "instructions": "Answer briefly.", "input": items, "max_output_tokens": 16,
                "temperature": 0}  # fmt: skip
        resp = post(router.url + "/v1/responses", body)
        assert resp.status == 200, resp.raw[:1000]
        no_internals(resp.raw)
        # the Responses SDK's pattern: the previous input, then the response's output items, then the new message
        items = items + resp.body["output"] + [{"role": "user", "content": f"Next part, {turn}."}]
    delta = Counters.read(engines.prefill, router) - before
    assert_follow_ups_reused(delta, 2)


def test_an_anthropic_messages_client_gets_reuse(engines, router):
    messages: list[dict[str, Any]] = [{"role": "user", "content": LONG + uuid.uuid4().hex}]
    headers = {"x-api-key": "sk-agent", "X-Claude-Code-Session-Id": uuid.uuid4().hex}
    before = Counters.read(engines.prefill, router)
    for turn in range(3):
        body = {
            "model": served_model(),
            "system": "Answer briefly.",
            "messages": messages,
            "max_tokens": 16,
            "temperature": 0,
        }
        resp = post(router.url + "/v1/messages", body, headers)
        assert resp.status == 200, resp.raw[:1000]
        no_internals(resp.raw)
        assert resp.body["type"] == "message"
        messages = messages + [{"role": "assistant", "content": resp.body["content"]},
                               {"role": "user", "content": f"And then, {turn}?"}]  # fmt: skip
    delta = Counters.read(engines.prefill, router) - before
    assert_follow_ups_reused(delta, 2)

"""The router in front of real vLLM CPU engines: a follow-up turn reads decode's KV over NIXL, exactly the tokens the
router replayed, and its greedy answer is token for token the answer of a plain recompute of the same history.

Proof comes from vLLM's own counters on prefill (prefix caching off there, so nothing is a local hit):
`vllm:prompt_tokens_by_source_total{source="external_kv_transfer"}` counts the prompt tokens whose KV prefill read
from decode, `vllm:nixl_xfer_time_seconds_count` the NIXL reads it made and `vllm:nixl_bytes_transferred_sum` what
they moved. Granularity: vLLM counts tokens exactly (`min(remote_num_tokens, prompt tokens)` minus prefill's own
hits, pull_scheduler.get_num_new_matched_tokens), while NIXL moves whole blocks, the partly filled last one too, so
the bytes are ceil(tokens / block size) blocks. Decode's `remote_num_tokens` is its `num_computed_tokens`: the
prompt plus every generated token but the last, whose KV was never computed.
"""

from __future__ import annotations

import uuid
from typing import Any

from .rig import (
    LONG,
    Counters,
    Turn,
    assert_same_answer,
    block_bytes,
    blocks,
    calibration_legs,
    chat,
    complete,
    covered_tokens,
)

TOKENS = 24


def test_follow_up_turns_read_exactly_the_replayed_tokens_from_decode(engines, router, model_dir):
    conv = f"exact-{uuid.uuid4().hex}"
    messages: list[dict[str, Any]] = []
    previous: Turn | None = None
    sampled = calibration_legs(router)
    for turn in range(4):
        messages.append({"role": "user", "content": f"{LONG} Question {turn}: what happened next?"})
        before = Counters.read(engines.prefill, router)
        result = chat(router.url, messages, conv, max_tokens=TOKENS)
        delta = Counters.read(engines.prefill, router) - before
        if previous is None:
            assert delta.hits == 0 and delta.misses == {"no_entry": 1}
            assert delta.external == delta.reads == 0
        else:
            covered = covered_tokens(previous)
            # The next prompt starts with exactly the tokens decode holds: the reply re-tokenizes to itself.
            assert result.prompt_token_ids[: len(covered)] == covered
            assert delta.hits == 1 and delta.misses == {}
            assert delta.reused == len(covered) == previous.usage["prompt_tokens"] + TOKENS - 1
            assert delta.external == delta.reused, "prefill did not read every replayed token from decode"
            assert delta.local_hit == 0
            assert delta.reads == 1
            assert delta.read_bytes == blocks(len(covered)) * block_bytes(model_dir)
            assert delta.declined == delta.failed == 0
        assert result.usage["completion_tokens"] == TOKENS
        assert_same_answer(result, chat(engines.prefill.url, messages, max_tokens=TOKENS))
        messages.append({"role": "assistant", "content": result.text})
        previous = result
    # The router sampled each prefill leg for its calibration (recomputeThreshold: Auto), from vLLM's own `usage`.
    after = calibration_legs(router)
    assert (after["recomputes"] - sampled["recomputes"], after["replays"] - sampled["replays"]) == (1, 3)


def test_completions_reuse_equals_recompute(engines, router, model_dir):
    conv = f"completion-{uuid.uuid4().hex}"
    prompt = LONG
    first = complete(router.url, prompt, conv, max_tokens=TOKENS)
    assert_same_answer(first, complete(engines.prefill.url, prompt, max_tokens=TOKENS))
    prompt += first.text + " And after that, the report says"
    before = Counters.read(engines.prefill, router)
    second = complete(router.url, prompt, conv, max_tokens=TOKENS)
    delta = Counters.read(engines.prefill, router) - before
    assert second.prompt_token_ids[: len(covered_tokens(first))] == covered_tokens(first)
    assert delta.hits == 1 and delta.external == delta.reused == len(covered_tokens(first))
    assert delta.read_bytes == blocks(len(covered_tokens(first))) * block_bytes(model_dir)
    assert_same_answer(second, complete(engines.prefill.url, prompt, max_tokens=TOKENS))


# vLLM answers 400 to `tools` with the default tool_choice "auto" unless the engine runs with
# --enable-auto-tool-choice and a --tool-call-parser, which the local example does not render; "none" still renders
# the tools into the prompt, which is what reuse depends on.
TOOL_CHOICE = "none"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look a thing up in the report.",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
        },
    }
]


def test_agentic_history_with_tool_calls_reuses_and_equals_recompute(engines, router):
    conv = f"tools-{uuid.uuid4().hex}"
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a careful assistant who checks the report."},
        {"role": "user", "content": LONG},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": '{"q": "summary"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "The report has four parts and a long appendix."},
    ]
    first = chat(router.url, messages, conv, tools=TOOLS, tool_choice=TOOL_CHOICE)
    assert_same_answer(first, chat(engines.prefill.url, messages, tools=TOOLS, tool_choice=TOOL_CHOICE))
    messages += [
        {"role": "assistant", "content": first.text},
        {"role": "user", "content": "Look up the appendix too."},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "call_2", "type": "function", "function": {"name": "lookup", "arguments": '{"q": "appendix"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_2", "content": "The appendix lists every source."},
    ]
    before = Counters.read(engines.prefill, router)
    second = chat(router.url, messages, conv, tools=TOOLS, tool_choice=TOOL_CHOICE)
    delta = Counters.read(engines.prefill, router) - before
    assert delta.hits == 1 and delta.external == delta.reused == len(covered_tokens(first))
    assert_same_answer(second, chat(engines.prefill.url, messages, tools=TOOLS, tool_choice=TOOL_CHOICE))

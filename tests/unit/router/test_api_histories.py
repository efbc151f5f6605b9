"""The Responses and Messages history digests against the prompt the engine would render for the same request.

The prompt comes from the simulator's conversion of each API (which mirrors vLLM 0.33's and is checked against
vLLM's own code in tests/integration/test_sim_apis_vllm.py) and its chat template. Two properties per API:
* safety: whenever two requests' prompts differ, their digests differ (an equal digest never replays blocks that
  cover another prompt);
* invariance: what a client's SDK changes when it resends a reply (ids, statuses, annotations, signatures,
  cache_control, key order, a string for a single text block) leaves the digest as it was.
"""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from duplex_sidecars.router.apis import anthropic, responses
from duplex_sidecars.sim import messages_api, responses_api
from duplex_sidecars.sim.chat_template import TemplateError


def digest(history: Any) -> str | None:
    return None if history is None else history.prefix_digest(len(history))


# -- Responses --------------------------------------------------------------------------------------------------

words = st.text(alphabet="abcdefgh ", min_size=1, max_size=12)
user_item = st.builds(lambda t: {"role": "user", "content": t}, words)
output_item = st.builds(
    lambda t, i: {
        "type": "message",
        "role": "assistant",
        "id": f"msg_{i}",
        "status": "completed",
        "content": [{"type": "output_text", "text": t, "annotations": []}],
    },
    words,
    st.integers(0, 99),
)
call_item = st.builds(
    lambda n, a, c: {"type": "function_call", "call_id": f"call_{c}", "name": n, "arguments": a, "id": f"fc_{c}"},
    st.sampled_from(["read", "write"]),
    st.sampled_from(['{"p":1}', '{"p":2}']),
    st.integers(0, 9),
)
output_of_call = st.builds(
    lambda c, o: {"type": "function_call_output", "call_id": f"call_{c}", "output": o}, st.integers(0, 9), words
)
responses_items = st.lists(st.one_of(user_item, output_item, call_item, output_of_call), min_size=1, max_size=6)


def responses_prompt(body: dict[str, Any]) -> list[int] | None:
    try:
        return responses_api.render_prompt(responses_api.parse_request(body), 1 << 20)
    except Exception:  # a request the engine refuses has no prompt
        return None


def mutated(items: list[Any], data: st.DataObject, fresh: st.SearchStrategy[Any]) -> list[Any]:
    """`items` changed in one way a client might change a history: nothing, an item replaced, dropped, swapped with
    its neighbour, or one added; the digests must tell apart whatever changes the prompt."""
    out = copy.deepcopy(items)
    kind = data.draw(st.sampled_from(["same", "replace", "drop", "swap", "add"]))
    i = data.draw(st.integers(0, len(out) - 1))
    if kind == "replace":
        out[i] = data.draw(fresh)
    elif kind == "drop" and len(out) > 1:
        del out[i]
    elif kind == "swap" and i + 1 < len(out):
        out[i], out[i + 1] = out[i + 1], out[i]
    elif kind == "add":
        out.insert(i, data.draw(fresh))
    return out


@settings(max_examples=300)
@given(responses_items, st.data(), st.sampled_from([None, "Be brief.", "Be thorough."]))
def test_responses_equal_digests_mean_equal_prompts(a, data, instructions):
    b = mutated(a, data, st.one_of(user_item, output_item, call_item, output_of_call))
    body_a = {"model": "m", "input": a, "instructions": instructions}
    body_b = {"model": "m", "input": b, "instructions": instructions}
    da, db = digest(responses.history(body_a)), digest(responses.history(body_b))
    pa, pb = responses_prompt(body_a), responses_prompt(body_b)
    if da is not None and da == db:
        assert pa == pb


def _resent(item: dict[str, Any]) -> dict[str, Any]:
    """An output item as another SDK resends it: new ids and statuses dropped, keys reordered, extra fields."""
    out = {k: item[k] for k in reversed(list(item))}
    out.pop("id", None)
    out.pop("status", None)
    if out.get("type") == "message":
        out["content"] = [{"text": p["text"], "type": p["type"], "logprobs": None} for p in out["content"]]
    return out


@settings(max_examples=200)
@given(responses_items)
def test_responses_digest_ignores_what_never_reaches_the_prompt(items):
    body = {"model": "m", "input": items}
    resent = {"model": "m", "input": [_resent(i) if i.get("type") else i for i in items]}
    assert responses_prompt(body) == responses_prompt(resent)  # the premise: the same prompt
    assert digest(responses.history(body)) == digest(responses.history(resent))


def test_responses_history_is_the_previous_input_and_output():
    first = {"model": "m", "instructions": "sys", "input": [{"role": "user", "content": "hi"}]}
    reply = responses.reply_of_body(
        {
            "status": "completed",
            "output": [
                {
                    "type": "message",
                    "role": "assistant",
                    "id": "msg_1",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": "hello", "annotations": []}],
                },
                {"type": "function_call", "call_id": "c1", "name": "read", "arguments": "{}", "id": "fc_1"},
            ],
        }
    )
    assert reply.finish_reason == "tool_calls" and reply.content == "hello" and len(reply.tool_calls) == 1
    history = responses.history(first)
    covered = responses.covered(history, reply)
    follow_up = {
        "model": "m",
        "instructions": "sys",
        "input": [
            {"role": "user", "content": "hi"},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "hello"}]},
            {"type": "function_call", "call_id": "c1", "name": "read", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "file contents"},
        ],
    }
    next_history = responses.history(follow_up)
    assert next_history.turn_boundary == 3  # system, user, then the folded assistant message: up to it
    assert next_history.matches(covered)


def test_responses_uncomparable_inputs_are_none():
    assert responses.history({"input": [{"type": "input_file", "file_id": "f"}]}) is None
    assert responses.history({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "x"}]}]}) is None
    unfinished = {"type": "message", "role": "assistant", "status": "incomplete", "content": [{"text": "x"}]}
    assert responses.history({"input": [{"role": "user", "content": "a"}, unfinished]}) is None


# -- Messages ---------------------------------------------------------------------------------------------------

text_block = st.builds(lambda t: {"type": "text", "text": t}, words)
tool_use = st.builds(
    lambda i, p: {"type": "tool_use", "id": f"tu_{i}", "name": "read", "input": {"p": p}},
    st.integers(0, 9),
    st.integers(0, 3),
)
tool_result = st.builds(
    lambda i, t: {"type": "tool_result", "tool_use_id": f"tu_{i}", "content": t}, st.integers(0, 9), words
)
user_message = st.builds(
    lambda c: {"role": "user", "content": c},
    st.one_of(words, st.lists(st.one_of(text_block, tool_result), min_size=1, max_size=3)),
)
assistant_message = st.builds(
    lambda c: {"role": "assistant", "content": c}, st.lists(st.one_of(text_block, tool_use), min_size=1, max_size=3)
)
conversations = st.lists(st.one_of(user_message, assistant_message), min_size=1, max_size=6)


def messages_prompt(body: dict[str, Any]) -> list[int] | None:
    try:
        return messages_api.render_prompt(messages_api.to_chat_request(messages_api.parse_request(body)))
    except (TemplateError, Exception):
        return None


@settings(max_examples=300)
@given(conversations, st.data(), st.sampled_from([None, "Be brief.", [{"type": "text", "text": "Be brief."}]]))
def test_messages_equal_digests_mean_equal_prompts(a, data, system):
    b = mutated(a, data, st.one_of(user_message, assistant_message))
    body_a = {"model": "m", "max_tokens": 8, "messages": a, **({"system": system} if system else {})}
    body_b = {"model": "m", "max_tokens": 8, "messages": b, **({"system": system} if system else {})}
    da, db = digest(anthropic.history(body_a)), digest(anthropic.history(body_b))
    if da is not None and da == db:
        assert messages_prompt(body_a) == messages_prompt(body_b)


def _decorated(message: dict[str, Any]) -> dict[str, Any]:
    """The same message with what never reaches the prompt: cache_control, a thinking signature, a redacted block."""
    out = copy.deepcopy(message)
    content = out["content"]
    if isinstance(content, str):
        out["content"] = [{"type": "text", "text": content, "cache_control": {"type": "ephemeral"}}]
    else:
        for block in content:
            block["cache_control"] = {"type": "ephemeral"}
        if out["role"] == "assistant":
            content.insert(0, {"type": "redacted_thinking", "data": "opaque"})
    return {k: out[k] for k in reversed(list(out))}


@settings(max_examples=200)
@given(conversations)
def test_messages_digest_ignores_what_never_reaches_the_prompt(conversation):
    body = {"model": "m", "max_tokens": 8, "messages": conversation}
    decorated = {"model": "m", "max_tokens": 8, "messages": [_decorated(m) for m in conversation]}
    assert digest(anthropic.history(body)) == digest(anthropic.history(decorated))


def test_messages_history_is_the_previous_messages_and_the_returned_blocks():
    first = {"model": "m", "max_tokens": 8, "system": "sys", "messages": [{"role": "user", "content": "hi"}]}
    reply = anthropic.reply_of_body(
        {
            "stop_reason": "tool_use",
            "content": [
                {"type": "text", "text": "let me look"},
                {"type": "tool_use", "id": "tu_1", "name": "read", "input": {"p": 1}},
            ],
        }
    )
    assert reply.finish_reason == "tool_calls" and reply.content == "let me look"
    covered = anthropic.covered(anthropic.history(first), reply)
    follow_up = {
        "model": "m",
        "max_tokens": 8,
        "system": [{"type": "text", "text": "sys"}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "let me look"},
                    {"type": "tool_use", "id": "tu_1", "name": "read", "input": {"p": 1}},
                ],
            },
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "tu_1", "content": "data"}]},
        ],
    }
    assert anthropic.history(follow_up).matches(covered)


def test_messages_stop_sequences_and_uncomparable_blocks():
    assert anthropic.reply_of_body({"stop_reason": "stop_sequence", "content": []}).finish_reason == "stop_sequence"
    no_id = {"role": "assistant", "content": [{"type": "tool_use", "name": "read", "input": {}}]}
    assert anthropic.history({"messages": [no_id]}) is None  # vLLM would give it a new id every second
    url_image = {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}}
    assert anthropic.history({"messages": [{"role": "user", "content": [url_image]}]}) is None

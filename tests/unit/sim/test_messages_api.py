"""/v1/messages: the conversion of system + messages to a chat request (vLLM's to_chat_completion_request), the
validation vLLM does, and the answers it gives, in process (no NIXL: the P-D reads run in tests/integration)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from duplex_sidecars import protocol as pr
from duplex_sidecars.sim import generation
from duplex_sidecars.sim import messages_api as api
from duplex_sidecars.sim.chat_parse import parse_messages
from duplex_sidecars.sim.chat_template import render_conversation
from duplex_sidecars.sim.validation import RequestError

from .sim_app import sim_client, sse_events

KV = pr.KV_PARAMS_FIELD
USE = {"type": "tool_use", "id": "t1", "name": "f", "input": {"city": "Oslo"}}
CALL = {"id": "t1", "type": "function", "function": {"name": "f", "arguments": '{"city": "Oslo"}'}}


def convert(body: dict[str, Any]) -> list[dict[str, Any]]:
    req = api.parse_request({"model": "sim", "max_tokens": 9, **json.loads(json.dumps(body))})
    return api.to_chat_request(req).messages


@pytest.mark.parametrize(
    ("body", "messages"),
    [
        ({"messages": [{"role": "user", "content": "hi"}]}, [{"role": "user", "content": "hi"}]),
        ({"system": "S", "messages": []}, [{"role": "system", "content": "S"}]),
        (
            {"system": [{"type": "text", "text": "A"}, {"type": "text", "text": "B"}], "messages": []},
            [{"role": "system", "content": "AB"}],
        ),
        ({"system": [{"type": "text", "text": "x-anthropic-billing-header: cch=9"}], "messages": []}, []),
        # inline system messages stay where they are (the simulator's template accepts them anywhere)
        (
            {"messages": [{"role": "user", "content": "u"}, {"role": "system", "content": "late"}]},
            [{"role": "user", "content": "u"}, {"role": "system", "content": "late"}],
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}]}]},
            [{"role": "user", "content": "a"}],
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]},
            [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
        ),
        ({"messages": [{"role": "user", "content": []}]}, []),  # a user message with nothing is dropped...
        ({"messages": [{"role": "assistant", "content": []}]}, [{"role": "assistant"}]),  # ...an assistant one kept
        # the previous reply resent: thinking becomes reasoning (signatures dropped), redacted thinking is dropped
        (
            {
                "messages": [
                    {
                        "role": "assistant",
                        "content": [
                            {"type": "thinking", "thinking": "a", "signature": "s"},
                            {"type": "thinking", "thinking": "b"},
                            {"type": "redacted_thinking", "data": "zz"},
                            {"type": "text", "text": "t"},
                            USE,
                        ],
                    }
                ]
            },
            [{"role": "assistant", "reasoning": "ab", "tool_calls": [CALL], "content": "t"}],
        ),
        # a user's tool results come before the rest of its message, as tool messages
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "before"},
                            {
                                "type": "tool_result",
                                "tool_use_id": "t1",
                                "content": [{"type": "text", "text": "x"}, {"type": "text", "text": "y"}],
                            },
                            {"type": "tool_result", "tool_use_id": "t2", "content": "z", "is_error": True},
                        ],
                    }
                ]
            },
            [
                {"role": "tool", "tool_call_id": "t1", "content": "x\ny"},
                {"role": "tool", "tool_call_id": "t2", "content": "z"},
                {"role": "user", "content": "before"},
            ],
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "tool_result",
                                "tool_use_id": "t1",
                                "content": [{"type": "image", "source": {"type": "url", "url": "http://i"}}],
                            }
                        ],
                    }
                ]
            },
            [
                {"role": "tool", "tool_call_id": "t1", "content": ""},
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://i"}}]},
            ],
        ),
        (
            {
                "messages": [
                    {"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "r"}]}
                ]
            },
            [{"role": "assistant", "content": "Tool result: r"}],
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": [{"type": "image", "source": {"type": "base64", "data": "QQ=="}}]}
                ]
            },
            [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,QQ=="}}]}],
        ),
    ],
)
def test_messages_become_chat_messages_as_vllm_converts_them(body, messages):
    assert convert(body) == messages


def test_the_previous_reply_resent_reaches_the_prompt_as_its_blocks_text():
    """A text block with or without extras, or the same text as a string, renders the same prompt."""
    prompts = set()
    for reply in ([{"type": "text", "text": "ka lo"}], [{"type": "text", "text": "ka lo", "citations": None}], "ka lo"):
        messages = [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": reply},
            {"role": "user", "content": "next"},
        ]
        prompts.add(tuple(render_conversation(parse_messages(convert({"messages": messages})))))
    assert len(prompts) == 1


def test_tools_become_chat_tools_and_change_with_tool_blocks():
    tool = {"name": "f", "description": "F", "input_schema": {"properties": {}}}
    body = {"model": "sim", "max_tokens": 5, "messages": [], "tools": [tool, {**tool, "name": "g", "strict": True}]}
    assert api.to_chat_request(api.parse_request(body)).tools == [
        {
            "type": "function",
            "function": {"name": "f", "description": "F", "parameters": {"properties": {}, "type": "object"}},
        },
        {
            "type": "function",
            "function": {
                "name": "g",
                "description": "F",
                "parameters": {"properties": {}, "type": "object"},
                "strict": True,
            },
        },
    ]
    removal = {"role": "system", "content": [{"type": "tool_removal", "tool": {"type": "tool_reference", "name": "f"}}]}
    chat = api.to_chat_request(api.parse_request({**body, "messages": [removal]}))
    assert [t["function"]["name"] for t in chat.tools or []] == ["g"] and chat.messages == []
    with pytest.raises(RequestError) as info:
        bad = {
            "role": "system",
            "content": [{"type": "tool_addition", "tool": {"type": "tool_reference", "name": "x"}}],
        }
        api.to_chat_request(api.parse_request({**body, "messages": [bad]}))
    assert info.value.status == 400 and "not declared in tools" in info.value.message


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "sim", "messages": []}, "body.max_tokens"),
        ({"max_tokens": 5}, "body.model"),
        ({"model": "", "max_tokens": 5, "messages": []}, "body.model"),
        ({"model": "sim", "max_tokens": 0, "messages": []}, "body.max_tokens"),
        ({"model": "sim", "max_tokens": 5, "messages": [{"role": "tool", "content": "x"}]}, "body.messages.0.role"),
        (
            {"model": "sim", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "weird"}]}]},
            "body.messages.0.content",
        ),  # the string branch of `str | list[block]` is reported first
        (
            {
                "model": "sim",
                "max_tokens": 5,
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "tool_addition", "tool": {"type": "tool_reference", "name": "f"}}],
                    }
                ],
            },
            "body.messages.0",
        ),
        ({"model": "sim", "max_tokens": 5, "messages": [], "tools": [{"name": "f"}]}, "body.tools.0.input_schema"),
        ({"model": "sim", "max_tokens": 5, "messages": [], "tool_choice": {"type": "tool"}}, "body.tool_choice"),
        (
            {"model": "sim", "max_tokens": 2000, "messages": [], "thinking": {"type": "enabled", "budget_tokens": 5}},
            "body.thinking.enabled.budget_tokens",
        ),
        (
            {"model": "sim", "max_tokens": 5, "messages": [], "thinking": {"type": "enabled", "budget_tokens": 1024}},
            "body",
        ),
        ({"model": "sim", "max_tokens": 5, "messages": [], KV: "x"}, "body.kv_transfer_params"),
    ],
)
def test_invalid_bodies_get_the_apps_400(body, param):
    with pytest.raises(RequestError) as info:
        api.parse_request(body)
    assert (info.value.status, info.value.type, info.value.param) == (400, "Bad Request", param)


def test_prefill_legs_skip_the_thinking_budget_check():
    body = {"model": "sim", "max_tokens": 1, "messages": [], "thinking": {"type": "enabled", "budget_tokens": 1024}}
    assert api.parse_request({**body, KV: pr.miss_params()}).max_tokens == 1


# -- the route, in process ----------------------------------------------------------------------------------------
async def test_a_prefill_leg_answers_with_prefills_params_and_no_nulls():
    async with sim_client(engine_id="p-unit", max_model_len=4096) as client:
        body = {
            "model": "sim",
            "max_tokens": 100,
            "system": "Be brief.",
            "messages": [{"role": "user", "content": "Tell me about the sea."}],
        }
        resp = await client.post(
            "/v1/messages", json=pr.prefill_leg_body(body, pr.miss_params()), headers={"X-Request-Id": "given"}
        )
        assert resp.status == 200 and resp.content_type == "application/json"
        out = await resp.json()
        plain = await (await client.post("/v1/messages", json=body)).json()
    assert list(out) == ["id", "type", "role", "content", "model", "stop_reason", "usage", KV]
    assert (out["id"], out["stop_reason"], out["usage"]["output_tokens"]) == ("chatcmpl-given", "max_tokens", 1)
    assert out[KV]["do_remote_prefill"] is True and out[KV]["remote_request_id"].startswith("chatcmpl-given-")
    assert out["content"][0]["text"] == plain["content"][0]["text"].split()[0]
    assert KV not in plain and plain["stop_reason"] == "end_turn"  # a natural end; no params, no key
    assert list(plain["usage"]) == ["input_tokens", "output_tokens"]


async def test_a_stream_is_message_start_to_message_stop_without_params():
    async with sim_client(max_model_len=4096) as client:
        body = {
            "model": "sim",
            "max_tokens": 3,
            "stream": True,
            "messages": [{"role": "user", "content": "Hi."}],
            KV: pr.miss_params(),
        }
        resp = await client.post("/v1/messages", json=body)
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        raw = await resp.read()
    assert b"kv_transfer_params" not in raw and b"[DONE]" not in raw  # not even from a prefill-marked request
    events = sse_events(raw)
    # 7 prompt tokens: <|im_start|> user Hi . <|im_end|> <|im_start|> assistant
    assert [name for name, _ in events] == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert events[0][1] == {
        "type": "message_start",
        "message": {
            "id": events[0][1]["message"]["id"],
            "type": "message",
            "role": "assistant",
            "content": [],
            "model": "sim",
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 7, "output_tokens": 0},
        },
    }
    assert events[1][1] == {"type": "content_block_start", "content_block": {"type": "text", "text": ""}, "index": 0}
    assert events[-2][1] == {
        "type": "message_delta",
        "delta": {"stop_reason": "max_tokens", "stop_sequence": None},
        "usage": {"input_tokens": 7, "output_tokens": 3},
    }
    assert events[-1][1] == {"type": "message_stop"}


@pytest.mark.parametrize(
    ("body", "status", "error_type"),
    [
        ({"model": "other", "max_tokens": 5, "messages": []}, 404, "not_found_error"),
        ({"model": "sim", "max_tokens": 5000, "messages": []}, 400, "invalid_request_error"),
        (
            {"model": "sim", "max_tokens": 5, "messages": [{"role": "user", "content": "word " * 2000}]},
            400,
            "invalid_request_error",
        ),
    ],
)
async def test_handler_errors_have_anthropics_shape(body, status, error_type):
    async with sim_client(max_model_len=2000) as client:
        resp = await client.post("/v1/messages", json=body)
        out = await resp.json()
    assert resp.status == status and list(out) == ["type", "error"] and out["type"] == "error"
    assert list(out["error"]) == ["type", "message"] and out["error"]["type"] == error_type


async def test_a_failed_remote_load_is_an_api_error_in_both_modes():
    params = {
        **pr.miss_params(),
        "do_remote_decode": False,
        "do_remote_prefill": True,
        "remote_engine_id": "gone",
        "remote_request_id": "r",
        "remote_block_ids": [[0]],
        "remote_host": "127.0.0.1",
        "remote_port": 9,
        "remote_num_tokens": 3,
    }
    body = {"model": "sim", "max_tokens": 5, "messages": [{"role": "user", "content": "Hi."}], KV: params}
    async with sim_client() as client:
        resp = await client.post("/v1/messages", json=body)
        assert resp.status == 500
        assert await resp.json() == {
            "type": "error",
            "error": {"type": "api_error", "message": "Internal server error"},
        }
        resp = await client.post("/v1/messages", json={**body, "stream": True})
        events = sse_events(await resp.read())
    assert resp.status == 200 and [name for name, _ in events] == ["message_start", "error"]


# -- the follow-up turn's prompt starts with what decode computed -------------------------------------------------
_words = st.lists(st.sampled_from(["sail", "reef", "wind", "knot", "mast", "?", "!", "Ahoy,"]), min_size=1, max_size=8)


@settings(max_examples=80)
@given(
    system=st.one_of(st.none(), _words), question=_words, follow=_words, cap=st.integers(1, 70), as_blocks=st.booleans()
)
def test_the_follow_up_prompt_starts_with_decodes_tokens(system, question, follow, cap, as_blocks):
    """Previous messages + the assistant message with the content blocks as returned (or their text) + a new user
    message renders a prompt that starts with the previous prompt and the reply tokens decode has KV for."""
    body: dict[str, Any] = {
        "model": "sim",
        "max_tokens": cap,
        "messages": [{"role": "user", "content": " ".join(question)}],
    }
    if system:
        body["system"] = [{"type": "text", "text": " ".join(system)}]
    prompt = api.render_prompt(api.to_chat_request(api.parse_request(json.loads(json.dumps(body)))))
    reply = generation.reply(prompt, cap)
    text = generation.chat_text(reply.tokens)
    content = [{"type": "text", "text": text}] if as_blocks else text
    follow_up = {
        **body,
        "messages": body["messages"]
        + [{"role": "assistant", "content": content}, {"role": "user", "content": " ".join(follow)}],
    }
    next_prompt = api.render_prompt(api.to_chat_request(api.parse_request(follow_up)))
    computed = prompt + list(reply.tokens[:-1])  # the last sampled token has no KV yet
    assert next_prompt[: len(computed)] == computed

"""/v1/responses: the conversion of instructions + input to chat messages (vLLM's construct_input_messages), the
validation vLLM does, and the answers it gives, in process (no NIXL: the P-D reads run in tests/integration)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from duplex_sidecars import protocol as pr
from duplex_sidecars.sim import generation
from duplex_sidecars.sim import responses_api as api
from duplex_sidecars.sim.chat_parse import parse_messages
from duplex_sidecars.sim.chat_template import render_conversation
from duplex_sidecars.sim.validation import RequestError

from .sim_app import sim_client, sse_events

KV = pr.KV_PARAMS_FIELD
OUT = {
    "type": "message",
    "role": "assistant",
    "id": "msg_1",
    "status": "completed",
    "phase": None,
    "content": [{"type": "output_text", "text": "answer", "annotations": [], "logprobs": None}],
}
CALL = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": '{"x": 1}', "id": "fc_1"}
FN_CALL = {"id": "c1", "function": {"name": "f", "arguments": '{"x": 1}'}, "type": "function"}


def convert(body: dict[str, Any]) -> list[dict[str, Any]]:
    req = api.parse_request(json.loads(json.dumps(body)))
    return api.input_messages(req.instructions, req.input)


@pytest.mark.parametrize(
    ("body", "messages"),
    [
        ({"input": "hi"}, [{"role": "user", "content": "hi"}]),
        (
            {"input": "hi", "instructions": "be brief"},
            [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
        ),
        ({"input": "hi", "instructions": ""}, [{"role": "user", "content": "hi"}]),
        # messages pass through whole (the parse picks role, content, name)
        (
            {"input": [{"role": "user", "content": "hi", "name": "bob"}]},
            [{"role": "user", "content": "hi", "name": "bob"}],
        ),
        # a previous output item: only its first part's text, as a plain assistant message
        ({"input": [OUT]}, [{"role": "assistant", "content": "answer"}]),
        (
            {
                "input": [
                    {**OUT, "content": [{"type": "output_text", "text": "a"}, {"type": "output_text", "text": "b"}]}
                ]
            },
            [{"role": "assistant", "content": "a"}],
        ),
        ({"input": [{"role": "assistant", "content": "plain"}]}, [{"role": "assistant", "content": "plain"}]),
        # tool calls join the assistant message before them; a message after calls fills in its content
        (
            {"input": [OUT, CALL, {**CALL, "call_id": "c2"}]},
            [{"role": "assistant", "content": "answer", "tool_calls": [FN_CALL, {**FN_CALL, "id": "c2"}]}],
        ),
        (
            {"input": [CALL, OUT, OUT]},
            [
                {"role": "assistant", "tool_calls": [FN_CALL], "content": "answer"},
                {"role": "assistant", "content": "answer"},
            ],
        ),
        (
            {"input": [{**CALL, "namespace": "ns"}]},
            [
                {
                    "role": "assistant",
                    "tool_calls": [{**FN_CALL, "function": {"name": "ns__f", "arguments": '{"x": 1}'}}],
                }
            ],
        ),
        (
            {"input": [{"type": "function_call_output", "call_id": "c1", "output": "42", "id": "o1"}]},
            [{"role": "tool", "content": "42", "tool_call_id": "c1"}],
        ),
        (
            {"input": [{"type": "custom_tool_call", "call_id": "c9", "name": "sh", "input": "ls"}]},
            [
                {
                    "role": "assistant",
                    "tool_calls": [
                        {"id": "c9", "function": {"name": "sh", "arguments": '{"input": "ls"}'}, "type": "function"}
                    ],
                }
            ],
        ),
        # reasoning: its content, else its first summary; it fills the reasoning of the assistant message before it
        (
            {
                "input": [
                    {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "t"}]},
                    OUT,
                ]
            },
            [{"role": "assistant", "reasoning": "t", "content": "answer"}],
        ),
        (
            {"input": [{"type": "reasoning", "summary": [{"type": "summary_text", "text": "s"}]}]},
            [{"role": "assistant", "reasoning": "s"}],
        ),
        ({"input": [{"type": "reasoning", "summary": []}]}, [{"role": "assistant", "reasoning": ""}]),
    ],
)
def test_input_becomes_chat_messages_as_vllm_converts_it(body, messages):
    assert convert(body) == messages


def test_the_previous_reply_resent_reaches_the_prompt_as_its_text_only():
    """Ids, statuses, annotations, logprobs and phases of resent output items do not change the prompt."""
    first = [{"role": "user", "content": "q"}]
    variants = [
        OUT,
        {**OUT, "id": "msg_other", "status": "incomplete", "phase": "final_answer"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "answer"}]},
        {"role": "assistant", "content": "answer"},
    ]
    prompts = set()
    for item in variants:
        items = first + [item, {"role": "user", "content": "next"}]
        prompts.add(tuple(render_conversation(parse_messages(convert({"input": items})))))
    assert len(prompts) == 1


@pytest.mark.parametrize(
    ("last", "continues"),
    [
        ({**OUT, "status": "incomplete"}, True),
        ({**OUT, "status": "in_progress"}, True),
        (OUT, False),
        ({key: v for key, v in OUT.items() if key != "status"}, False),  # vLLM fills in "completed"
        ({"type": "reasoning", "summary": [], "status": "incomplete"}, True),
        ({"role": "user", "content": "q", "status": "incomplete"}, True),
        ({"role": "user", "content": "q"}, False),
        (CALL, False),
    ],
)
def test_an_unfinished_last_message_is_continued(last, continues):
    req = api.parse_request({"input": [{"role": "user", "content": "q"}, last]})
    assert api.continues_final_message(req.input) is continues
    prompt = api.render_prompt(req, 1000)
    assert (prompt[-2:] == [1, generation.token_id("assistant")]) is not continues


def test_function_tools_become_chat_tools():
    tools = [
        {"type": "function", "name": "f", "parameters": {"type": "object"}},
        {"type": "function", "name": "g", "description": "G", "strict": True},
    ]
    assert api.tool_dicts(api.parse_request({"input": "x", "tools": tools}).tools) == [
        {"type": "function", "function": {"name": "f", "description": None, "parameters": {"type": "object"}}},
        {"type": "function", "function": {"name": "g", "description": "G", "parameters": None, "strict": True}},
    ]
    assert api.tool_dicts([]) is None


@pytest.mark.parametrize(
    ("body", "status", "type_", "param"),
    [
        ({}, 400, "Bad Request", "body.input"),
        ({"input": 5}, 400, "Bad Request", "body.input"),
        ({"input": "x", "max_output_tokens": 1.5}, 400, "Bad Request", "body.max_output_tokens"),
        ({"input": "x", KV: [1]}, 400, "Bad Request", "body.kv_transfer_params"),
        # a bad item fails the list branch of `str | list`: pydantic reports the string branch first
        ({"input": [{"role": "user"}]}, 400, "Bad Request", "body.input"),
        (
            {"input": [{"role": "assistant", "content": [{"type": "output_text", "text": "x"}]}]},
            400,
            "Bad Request",
            "body.input",
        ),
        ({"input": [{"type": "reasoning", "content": []}]}, 400, "Bad Request", "body.input"),
        ({"input": "x", "prompt": {"id": "p"}}, 400, "BadRequestError", "prompt"),
        ({"input": "x", "background": True, "store": False}, 400, "BadRequestError", "background"),
        ({"input": "x", "tool_choice": "required"}, 400, "BadRequestError", "tool_choice"),
        (
            {
                "input": "x",
                "tools": [{"type": "function", "name": "f"}],
                "tool_choice": {"type": "function", "name": "g"},
            },
            400,
            "BadRequestError",
            "tool_choice",
        ),
        ({"input": "x", "tools": [{"type": "web_search_preview"}]}, 400, "BadRequestError", "tools"),
    ],
)
def test_invalid_requests_are_refused_as_vllm_refuses_them(body, status, type_, param):
    with pytest.raises(RequestError) as info:
        api.parse_request(body)
    assert (info.value.status, info.value.type, info.value.param) == (status, type_, param)


@pytest.mark.parametrize(
    ("item", "status", "message"),
    [
        (
            {"type": "item_reference", "id": "msg_0"},
            400,
            "Unsupported input item type: item_reference (parameter=input)",
        ),
        (
            {"type": "reasoning", "summary": [], "encrypted_content": "z"},
            400,
            "Encrypted content is not supported. (parameter=input)",
        ),
        ({**OUT, "content": []}, 500, "list index out of range"),
    ],
)
def test_items_vllm_accepts_but_cannot_convert(item, status, message):
    with pytest.raises(RequestError) as info:
        convert({"input": [item]})
    assert (info.value.status, info.value.message) == (status, message)


def test_without_tools_tool_choice_auto_becomes_none():
    assert api.parse_request({"input": "x"}).body["tool_choice"] == "none"
    assert api.parse_request({"input": "x", "tools": [{"type": "function", "name": "f"}]}).tool_choice == "auto"


# -- the route, in process ----------------------------------------------------------------------------------------
RESPONSE_KEYS = [
    "id",
    "created_at",
    "incomplete_details",
    "instructions",
    "metadata",
    "model",
    "object",
    "output",
    "parallel_tool_calls",
    "temperature",
    "tool_choice",
    "tools",
    "top_p",
    "background",
    "max_output_tokens",
    "max_tool_calls",
    "previous_response_id",
    "prompt",
    "prompt_cache_options",
    "prompt_cache_key",
    "prompt_cache_retention",
    "reasoning",
    "safety_identifier",
    "service_tier",
    "status",
    "text",
    "top_logprobs",
    "truncation",
    "usage",
    "user",
    "presence_penalty",
    "frequency_penalty",
    "kv_transfer_params",
    "ec_transfer_params",
    "input_messages",
    "output_messages",
]


async def test_a_prefill_leg_answers_with_prefills_params():
    async with sim_client(engine_id="p-unit", max_model_len=4096) as client:
        body = {
            "input": "Tell me about the sea.",
            "instructions": "Be brief.",
            "max_output_tokens": 1,
            KV: pr.miss_params(),
            "request_id": "resp_given",
        }
        resp = await client.post("/v1/responses", json=body)
        assert resp.status == 200 and resp.content_type == "application/json"
        out = await resp.json()
    assert list(out) == RESPONSE_KEYS
    assert (out["id"], out["object"], out["status"], out["incomplete_details"]) == (
        "resp_given",
        "response",
        "incomplete",
        {"reason": "max_output_tokens"},
    )
    (item,) = out["output"]
    assert list(item) == ["id", "content", "role", "status", "type", "phase"] and item["status"] == "incomplete"
    assert item["content"] == [
        {"annotations": [], "text": item["content"][0]["text"], "type": "output_text", "logprobs": None}
    ]
    params = out[KV]
    assert params["do_remote_prefill"] is True and params["remote_engine_id"] == "p-unit"
    assert params["remote_request_id"].startswith("resp_given_0-")
    assert params["remote_num_tokens"] == out["usage"]["input_tokens"]
    assert out["usage"]["input_tokens_details"]["cache_write_tokens"] == out["usage"]["input_tokens"] // 16 * 16
    assert out["max_output_tokens"] == 1 and out["tool_choice"] == "none" and out["temperature"] == 1.0


async def test_plain_requests_are_deterministic_and_report_cache_hits():
    async with sim_client(max_model_len=4096) as client:
        body = {"input": "Tell me about the sea, at length, with many words in it.", "max_output_tokens": 10}
        first = await (await client.post("/v1/responses", json=body)).json()
        again = await (await client.post("/v1/responses", json=body)).json()
    assert first[KV] is None and first["output"][0]["content"] == again["output"][0]["content"]
    assert first["id"] != again["id"] and first["id"].startswith("resp_") and len(first["id"]) == 5 + 16
    cached = again["usage"]["input_tokens_details"]["cached_tokens"]
    assert (
        first["usage"]["input_tokens_details"]["cached_tokens"] == 0
        and cached == first["usage"]["input_tokens"] // 16 * 16
    )


async def test_a_stream_frames_events_as_vllm_does():
    async with sim_client(max_model_len=4096) as client:
        resp = await client.post(
            "/v1/responses",
            json={"input": "Hello there, sailor.", "stream": True, "max_output_tokens": 3, "ignore_eos": True},
        )
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        events = sse_events(await resp.read())
    assert [name for name, _ in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
    ]
    for n, (name, data) in enumerate(events):
        assert data["type"] == name and data["sequence_number"] == n and list(data) == sorted(data)
    final = events[-1][1]["response"]
    assert list(final) == RESPONSE_KEYS and final["status"] == "incomplete" and final[KV] is None
    assert final["output"] == [events[-2][1]["item"]]
    deltas = "".join(d["delta"] for name, d in events if name == "response.output_text.delta")
    assert deltas == final["output"][0]["content"][0]["text"] == events[-4][1]["text"]


async def test_nothing_is_stored():
    async with sim_client() as client:
        resp = await client.post("/v1/responses", json={"input": "x", "previous_response_id": "resp_1"})
        assert resp.status == 404 and (await resp.json())["error"]["param"] == "response_id"
        assert (await client.get("/v1/responses/resp_1")).status == 404
        assert (await client.post("/v1/responses/resp_1/cancel")).status == 404
        resp = await client.post("/v1/responses", json={"input": "x", "background": True})
        assert resp.status == 400 and (await resp.json())["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"input": "x", "model": "other"}, 404, "model"),
        ({"input": "x", "max_output_tokens": 5000}, 400, "max_output_tokens"),
        ({"input": "x", "max_output_tokens": 0}, 400, "max_tokens"),
        ({"input": "word " * 2000}, 400, "input_tokens"),
        ({"input": "word " * 1995}, 400, "input"),  # 1995 words + 5 template tokens: the context, full
        ({"input": [{"role": "user", "content": [{"type": "input_text"}]}]}, 400, "body.input"),
    ],
)
async def test_engine_level_refusals(body, status, param):
    async with sim_client(max_model_len=2000) as client:
        resp = await client.post("/v1/responses", json=body)
        out = await resp.json()
    assert resp.status == status and out["error"]["param"] == param and out["error"]["code"] == status


async def test_a_failed_remote_load_is_an_internal_error_then_a_dropped_stream():
    params = {
        **pr.miss_params(),
        "do_remote_decode": False,
        "do_remote_prefill": True,
        "remote_engine_id": "gone",
        "remote_request_id": "r",
        "remote_block_ids": [[0]],
        "remote_host": "127.0.0.1",
        "remote_port": 9,
        "remote_num_tokens": 12,
    }
    async with sim_client() as client:
        resp = await client.post("/v1/responses", json={"input": "x", KV: params})
        assert resp.status == 500 and (await resp.json())["error"]["message"] == "Internal server error"
        resp = await client.post("/v1/responses", json={"input": "x", KV: params, "stream": True})
        assert resp.status == 200
        with pytest.raises(Exception):  # noqa: B017 - aiohttp reports the cut as one of several errors
            await resp.read()


# -- the follow-up turn's prompt starts with what decode computed -------------------------------------------------
_words = st.lists(st.sampled_from(["sail", "reef", "wind", "knot", "mast", "?", "!", "Ahoy,"]), min_size=1, max_size=8)


@settings(max_examples=80)
@given(
    instructions=st.one_of(st.none(), _words),
    question=_words,
    follow=_words,
    cap=st.one_of(st.none(), st.integers(1, 70)),
    continue_reply=st.booleans(),
)
def test_the_follow_up_prompt_starts_with_decodes_tokens(instructions, question, follow, cap, continue_reply):
    """Previous input + the output item as returned (+ a new user message) renders a prompt that starts with the
    previous prompt and the reply tokens decode has KV for; resending an incomplete reply alone continues it."""
    body = {"input": [{"role": "user", "content": " ".join(question)}], "max_output_tokens": cap}
    if instructions:
        body["instructions"] = " ".join(instructions)
    prompt = api.render_prompt(api.parse_request(json.loads(json.dumps(body))), 10_000)
    reply = generation.reply(prompt, cap)
    status = api.status_of(reply.finish_reason)
    out = api.ResponseBuilder(api.parse_request(dict(body)), "sim", cap or 100)
    item = out.message(generation.chat_text(reply.tokens), status)
    tail = [] if continue_reply and status == "incomplete" else [{"role": "user", "content": " ".join(follow)}]
    follow_up = {**body, "input": body["input"] + [item] + tail}
    next_prompt = api.render_prompt(api.parse_request(json.loads(json.dumps(follow_up))), 10_000)
    computed = prompt + list(reply.tokens[:-1])  # the last sampled token has no KV yet
    assert next_prompt[: len(computed)] == computed
    if not tail:  # continue_final_message: the prompt is exactly prompt + reply, left open
        assert next_prompt == prompt + list(reply.tokens)

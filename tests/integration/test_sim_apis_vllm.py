"""The simulator's /v1/responses and /v1/messages against vLLM 0.33's own code, run in the cached vLLM virtualenv.

1. Conversions: for a table of request bodies, vLLM's ResponsesRequest + construct_input_messages (and
   AnthropicMessagesRequest + to_chat_completion_request), then its parse_chat_messages, give the conversation the
   chat template sees; the simulator's conversion must give the same conversation, tools and continue_final_message,
   and must refuse what vLLM refuses.
2. Wire shapes: bodies and SSE events from real simulator processes re-serialize to the same bytes through vLLM's
   pydantic models (ResponsesResponse, the streaming event union, AnthropicMessagesResponse, AnthropicStreamEvent),
   so no field is missing, extra, misplaced or mistyped.

A missing vLLM virtualenv or nixl package is a failure, not a skip (hack/setup-vllm.sh, hack/setup.sh).
"""

from __future__ import annotations

import json
import os
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from duplex_dev.launch.sim import sim_pair
from duplex_dev.versions import version
from duplex_sidecars import protocol as pr
from duplex_sidecars.sim import messages_api, responses_api
from duplex_sidecars.sim.chat_parse import parse_messages
from duplex_sidecars.sim.validation import RequestError

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(300)]

_VENV = Path(os.environ.get("DUPLEX_CACHE") or Path.home() / ".cache" / "duplex") / f"vllm-{version('VLLM_VERSION')}"

# Runs inside the vLLM virtualenv: stdin {"responses": [body], "messages": [body], "wire": [[kind, text]]}.
_CHECKER = r"""
import json, sys, types
from pydantic import TypeAdapter, ValidationError
from vllm.entrypoints.serve.exception_handling.handlers.validation import clean_loc_for_param
from openai.types.responses import ResponseStreamEvent
from vllm.entrypoints.openai.responses.protocol import (
    ResponseCompletedEvent, ResponseCreatedEvent, ResponseIncompleteEvent, ResponseInProgressEvent, ResponsesRequest,
    ResponsesResponse)
from vllm.entrypoints.openai.responses.utils import (
    construct_input_messages, construct_tool_dicts, should_continue_final_message)
from vllm.entrypoints.anthropic.protocol import (
    AnthropicErrorResponse, AnthropicMessagesRequest, AnthropicMessagesResponse, AnthropicStreamEvent)
from vllm.entrypoints.serve.engine.protocol import ErrorResponse
from vllm.entrypoints.anthropic.serving import AnthropicServingMessages
from vllm.renderers.chat_utils.chat_message import parse_chat_messages

RESPONSE_EVENTS = {"response.created": ResponseCreatedEvent, "response.in_progress": ResponseInProgressEvent,
                   "response.completed": ResponseCompletedEvent, "response.incomplete": ResponseIncompleteEvent}
MODEL_CONFIG = types.SimpleNamespace(multimodal_config=None, enable_prompt_embeds=False)  # text-only parse

def conversation(messages):
    conv, _, _ = parse_chat_messages(messages, MODEL_CONFIG, "string")
    return conv

def responses(body):
    req = ResponsesRequest(**body)
    messages = construct_input_messages(request_instructions=req.instructions, request_input=req.input)
    return {"conversation": conversation(messages), "tools": construct_tool_dicts(req.tools, req.tool_choice),
            "continue_final": should_continue_final_message(req.input)}

def messages(body):
    req = AnthropicMessagesRequest(**body)
    chat = AnthropicServingMessages.to_chat_completion_request(req, merge_inline_system=False)
    tools = [t.model_dump() for t in chat.tools] if chat.tools is not None else None
    return {"conversation": conversation(chat.messages), "tools": tools}

def outcome(fn, body):
    try:
        return {"ok": fn(body)}
    except ValidationError as e:  # FastAPI reports it with the first error's location as the param
        return {"error": 400, "kind": "ValidationError",
                "param": clean_loc_for_param(("body", *e.errors(include_url=False)[0]["loc"]))}
    except Exception as e:  # the status vLLM's exception handlers give it (create_error_response)
        client = isinstance(e, (ValueError, TypeError)) or type(e).__name__ == "VLLMValidationError"
        return {"error": 400 if client else 500, "kind": type(e).__name__, "message": str(e)}

def rewire(kind, text):
    if kind == "responses_body":
        return json.dumps(ResponsesResponse.model_validate_json(text).model_dump(mode="json", by_alias=True),
                          ensure_ascii=False, separators=(",", ":"))
    if kind == "responses_event":  # vLLM's own classes for the events that carry its response object
        model = RESPONSE_EVENTS.get(json.loads(text)["type"]) or TypeAdapter(ResponseStreamEvent)
        event = model.validate_json(text) if isinstance(model, TypeAdapter) else model.model_validate_json(text)
        return event.model_dump_json(indent=None, by_alias=True)
    if kind == "messages_body":
        return json.dumps(AnthropicMessagesResponse.model_validate_json(text).model_dump(exclude_none=True),
                          ensure_ascii=False, separators=(",", ":"))
    if kind == "messages_event":
        event = AnthropicStreamEvent.model_validate_json(text)
        if event.type == "message_stop":
            return event.model_dump_json(exclude_unset=True, exclude_none=True)
        return event.model_dump_json(exclude_unset=True)
    if kind == "openai_error":
        return ErrorResponse.model_validate_json(text).model_dump_json()
    if kind == "anthropic_error":
        return AnthropicErrorResponse.model_validate_json(text).model_dump_json()
    raise ValueError(kind)

data = json.load(sys.stdin)
print(json.dumps({
    "responses": [outcome(responses, b) for b in data.get("responses", [])],
    "messages": [outcome(messages, b) for b in data.get("messages", [])],
    "wire": [rewire(k, t) for k, t in data.get("wire", [])],
}, default=str))
"""


@pytest.fixture(scope="module")
def vllm() -> Any:
    python = _VENV / "bin" / "python"
    if not (python.exists() and (_VENV / ".duplex-vllm-ok").exists()):
        pytest.fail(f"the vLLM virtualenv {_VENV} is missing: run hack/setup-vllm.sh", pytrace=False)

    def run(data: dict[str, Any]) -> dict[str, Any]:
        env = {
            **os.environ,
            "VLLM_TARGET_DEVICE": "cpu",
            "HF_HUB_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "VLLM_LOGGING_LEVEL": "ERROR",
        }
        proc = subprocess.run(
            [str(python), "-c", _CHECKER], input=json.dumps(data), capture_output=True, text=True, timeout=240, env=env
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])

    return run


# -- 1. conversions ---------------------------------------------------------------------------------------------
FN = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather now",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}
RESPONSES_CASES: list[dict[str, Any]] = [
    {"input": "hello"},
    {"input": "hello", "instructions": "Be brief."},
    {"input": "hello", "instructions": ""},
    {"input": [{"role": "user", "content": "hi"}]},
    {"input": [{"role": "user", "content": "hi", "name": "bob", "id": "x"}]},
    {
        "input": [
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}],
            }
        ]
    },
    {
        "input": [
            {"role": "system", "content": "sys"},
            {"role": "developer", "content": "dev"},
            {"role": "user", "content": "u"},
        ]
    },
    {
        "input": [
            {"role": "system", "content": [{"type": "input_text", "text": "x-anthropic-billing-header: 1\nkeep"}]},
            {"role": "user", "content": "u"},
        ]
    },
    # previous output items resent as input: only the first part's text reaches the prompt
    {
        "input": [
            {"role": "user", "content": "q"},
            {
                "id": "msg_1",
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "phase": None,
                "content": [{"type": "output_text", "text": "answer", "annotations": [], "logprobs": None}],
            },
            {"role": "user", "content": "and?"},
        ]
    },
    {
        "input": [
            {"role": "user", "content": "q"},
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "a"}, {"type": "output_text", "text": "b"}],
            },
            {"role": "user", "content": "and?"},
        ]
    },
    {
        "input": [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "plain"},
            {"role": "user", "content": "and?"},
        ]
    },
    {
        "input": [
            {"role": "user", "content": "q"},
            {"type": "message", "role": "assistant", "content": [{"type": "input_text", "text": "as input"}]},
        ]
    },
    # an unfinished assistant message is continued
    {
        "input": [
            {"role": "user", "content": "q"},
            {
                "type": "message",
                "role": "assistant",
                "status": "incomplete",
                "content": [{"type": "output_text", "text": "partial"}],
            },
        ]
    },
    {
        "input": [
            {"role": "user", "content": "q"},
            {
                "type": "message",
                "role": "assistant",
                "status": "in_progress",
                "content": [{"type": "output_text", "text": "partial"}],
            },
        ]
    },
    {"input": [{"role": "user", "content": "q", "status": "incomplete", "type": "message"}]},
    # tool calls fold into the previous assistant message; outputs become tool messages
    {
        "input": [
            {"role": "user", "content": "weather?"},
            {
                "type": "function_call",
                "call_id": "c1",
                "name": "get_weather",
                "arguments": '{"city": "Oslo"}',
                "id": "fc_1",
                "status": "completed",
            },
            {"type": "function_call", "call_id": "c2", "name": "get_weather", "arguments": "not json"},
            {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
            {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "rain"}]},
        ],
        "tools": [FN],
    },
    {
        "input": [
            {"role": "user", "content": "q"},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "let me check"}]},
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
        ],
        "tools": [FN],
        "tool_choice": "required",
    },
    {
        "input": [
            {"role": "user", "content": "q"},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}", "namespace": "ns"},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "after"}]},
        ]
    },
    {
        "input": [
            {"type": "custom_tool_call", "call_id": "c9", "name": "shell", "input": "ls -l"},
            {"type": "custom_tool_call_output", "call_id": "c9", "output": "file"},
        ]
    },
    # reasoning items: content first, else the first summary
    {
        "input": [
            {"role": "user", "content": "q"},
            {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "think"}]},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "answer"}]},
        ]
    },
    {
        "input": [
            {"role": "user", "content": "q"},
            {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "sum"}]},
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "second"}]},
        ]
    },
    {
        "input": [
            {"role": "user", "content": "q"},
            {
                "type": "reasoning",
                "summary": [],
                "status": "incomplete",
                "content": [{"type": "reasoning_text", "text": "th"}],
            },
        ]
    },
    {
        "input": "x",
        "tools": [FN, {"type": "function", "name": "g", "strict": True, "parameters": None}],
        "tool_choice": "none",
    },
    {"input": "x", "tools": [FN], "tool_choice": {"type": "function", "name": "get_weather"}},
    # refused
    {"input": [{"type": "item_reference", "id": "msg_0"}]},
    {"input": [{"type": "reasoning", "summary": [], "encrypted_content": "zzz"}]},
    {"input": [{"role": "assistant", "content": [{"type": "output_text", "text": "no type"}]}]},
    {"input": [{"type": "message", "role": "user", "content": [{"type": "output_text", "text": "x"}]}]},
    {"input": [{"type": "reasoning", "content": [{"type": "reasoning_text", "text": "no summary"}]}]},
    {"input": [{"role": "user"}]},
    {"input": [{"role": "bogus", "content": "x"}]},
    {"input": [{"type": "function_call", "call_id": "c1", "name": "f"}]},
    {"input": "x", "tool_choice": "required"},
    {"input": "x", "prompt": {"id": "p"}},
    {"input": "x", "prompt": {"id": "p"}, "tool_choice": "required", "background": True, "store": False},
    {"input": "x", "prompt": {"id": "p"}, "background": True, "store": False},
    {"input": "x", "background": True, "store": False},
    {"input": 5},
    {},
]

TOOL = {
    "name": "get_weather",
    "description": "Weather now",
    "input_schema": {"properties": {"city": {"type": "string"}}},
}
MESSAGES_CASES: list[dict[str, Any]] = [
    {"messages": [{"role": "user", "content": "hi"}]},
    {"system": "Be brief.", "messages": [{"role": "user", "content": "hi"}]},
    {
        "system": [
            {"type": "text", "text": "x-anthropic-billing-header: 1"},
            {"type": "text", "text": "A"},
            {"type": "text", "text": "B"},
        ],
        "messages": [{"role": "user", "content": "hi"}],
    },
    {
        "messages": [
            {"role": "system", "content": "inline"},
            {"role": "user", "content": "u"},
            {"role": "system", "content": [{"type": "text", "text": "again"}]},
        ]
    },
    {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]},
    {"messages": [{"role": "user", "content": [{"type": "text", "text": ""}]}, {"role": "user", "content": "x"}]},
    # the previous reply resent: text and thinking blocks reach the prompt, signatures and redacted thinking do not
    {
        "messages": [
            {"role": "user", "content": "q"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "hmm", "signature": "s1"},
                    {"type": "redacted_thinking", "data": "opaque"},
                    {"type": "text", "text": "answer"},
                ],
            },
            {"role": "user", "content": "and?"},
        ]
    },
    {
        "messages": [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "answer"},
            {"role": "user", "content": "and?"},
        ]
    },
    {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": []}]},
    {
        "messages": [
            {"role": "user", "content": "q"},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "calling"},
                    {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Oslo", "a": [1, 2]}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": "sunny"},
                    {"type": "text", "text": "thanks"},
                ],
            },
        ],
        "tools": [TOOL],
    },
    {
        "messages": [
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "t1",
                        "content": [{"type": "text", "text": "x"}, {"type": "text", "text": "y"}],
                    }
                ],
            }
        ]
    },
    {"messages": [{"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "r"}]}]},
    {
        "messages": [{"role": "user", "content": "q"}],
        "tools": [TOOL, {**TOOL, "name": "b", "strict": True, "input_schema": {"type": "object"}}],
        "tool_choice": {"type": "none"},
    },
    {"messages": [{"role": "user", "content": "q"}], "tools": [TOOL], "tool_choice": {"type": "any"}},
    {
        "messages": [
            {
                "role": "system",
                "content": [{"type": "tool_removal", "tool": {"type": "tool_reference", "name": "get_weather"}}],
            },
            {"role": "user", "content": "q"},
        ],
        "tools": [TOOL, {**TOOL, "name": "other"}],
    },
    # refused
    {"messages": [{"role": "tool", "content": "x"}]},
    {"messages": [{"role": "user", "content": [{"type": "weird"}]}]},
    {
        "messages": [
            {"role": "user", "content": [{"type": "tool_addition", "tool": {"type": "tool_reference", "name": "x"}}]}
        ]
    },
    {"messages": [], "thinking": {"type": "enabled", "budget_tokens": 1024}},
    {"messages": [], "max_tokens": 0},
    {"messages": [], "model": ""},
]


def _sim_responses(body: dict[str, Any]) -> dict[str, Any]:
    req = responses_api.parse_request(json.loads(json.dumps(body)))
    messages = responses_api.input_messages(req.instructions, req.input)
    return {
        "conversation": parse_messages(messages),
        "tools": responses_api.tool_dicts(req.tools),
        "continue_final": responses_api.continues_final_message(req.input),
    }


def _sim_messages(body: dict[str, Any]) -> dict[str, Any]:
    req = messages_api.parse_request({"model": "sim", "max_tokens": 64, **json.loads(json.dumps(body))})
    chat = messages_api.to_chat_request(req)
    return {"conversation": parse_messages(chat.messages), "tools": chat.tools}


def _outcome(fn: Any, body: dict[str, Any]) -> dict[str, Any]:
    try:
        return {"ok": fn(body)}
    except RequestError as e:
        return {"error": e.status, "message": e.message, "param": e.param}


def test_conversions_match_vllm(vllm):
    ran = vllm(
        {"responses": RESPONSES_CASES, "messages": [{"model": "sim", "max_tokens": 64, **b} for b in MESSAGES_CASES]}
    )
    mismatches = []
    for route, cases, fn in (
        ("responses", RESPONSES_CASES, _sim_responses),
        ("messages", MESSAGES_CASES, _sim_messages),
    ):
        for body, theirs in zip(cases, ran[route], strict=True):
            ours = _outcome(fn, body)
            same = ours.get("ok", ours.get("error")) == theirs.get("ok", theirs.get("error"))
            # vLLM's own validation errors read the same; pydantic's are worded by FastAPI's handler instead.
            if theirs.get("kind") == "VLLMValidationError" and ours.get("message") != theirs["message"]:
                same = False
            if theirs.get("kind") == "ValidationError" and ours.get("param") != theirs["param"]:
                same = False
            if not same:
                mismatches.append({"route": route, "body": body, "vllm": theirs, "sim": ours})
    assert not mismatches, json.dumps(mismatches, indent=1)[:12000]


# -- 2. wire shapes ---------------------------------------------------------------------------------------------
BODIES = {
    "responses": {
        "input": "Tell me about the sea.",
        "max_output_tokens": 12,
        "instructions": "Be brief.",
        "tools": [FN],
        "tool_choice": {"type": "function", "name": "get_weather"},
        "metadata": {"k": "v"},
        "reasoning": {"effort": "low"},
        "temperature": 0.5,
        "text": {"format": {"type": "text"}},
        "prompt_cache_options": {"prewarm": True},
        "user": "u",
        "include": ["message.output_text.logprobs"],
    },
    "messages": {
        "model": "sim",
        "max_tokens": 12,
        "system": "Be brief.",
        "messages": [{"role": "user", "content": "Tell me about the sea."}],
    },
}
PREFILL_CAP = {"responses": "max_output_tokens", "messages": "max_tokens"}
REFUSED = {
    "responses": [{"input": "x", "model": "other"}, {"input": 5}, {"input": "x", "previous_response_id": "r"}],
    "messages": [
        {"model": "other", "max_tokens": 5, "messages": []},
        {"model": "sim", "messages": []},
        {"model": "sim", "max_tokens": 99999, "messages": []},
    ],
}


def _post(url: str, body: dict[str, Any]) -> tuple[int, str, bytes]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.headers["Content-Type"], resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers["Content-Type"], e.read()


def _events(raw: bytes) -> list[str]:
    """The data lines of an SSE body whose frames are `event: <type>` + `data: <json with that type>`."""
    out = []
    for frame in raw.decode().split("\n\n")[:-1]:
        head, data = frame.split("\n")
        assert json.loads(data.removeprefix("data: "))["type"] == head.removeprefix("event: ")
        out.append(data.removeprefix("data: "))
    return out


def _collect(p: Any, d: Any) -> list[tuple[str, str]]:
    """Both legs of a turn, decode streamed and not, and some refusals, as (kind, exact text) for the checker."""
    wire: list[tuple[str, str]] = []
    for route, body in BODIES.items():
        for stream in (False, True):
            leg = {**body, PREFILL_CAP[route]: 1, "stream": False, pr.KV_PARAMS_FIELD: pr.miss_params()}
            status, ctype, raw = _post(f"{p.url}/v1/{route}", leg)
            assert status == 200 and ctype == "application/json"
            wire.append((f"{route}_body", raw.decode()))
            leg = {**body, "stream": stream, pr.KV_PARAMS_FIELD: json.loads(raw)[pr.KV_PARAMS_FIELD]}
            status, ctype, raw = _post(f"{d.url}/v1/{route}", leg)
            assert status == 200 and ctype.startswith("text/event-stream" if stream else "application/json")
            wire += [(f"{route}_event", e) for e in _events(raw)] if stream else [(f"{route}_body", raw.decode())]
        for bad in REFUSED[route]:
            status, _, raw = _post(f"{d.url}/v1/{route}", bad)
            shape = "anthropic" if route == "messages" and json.loads(raw).get("type") == "error" else "openai"
            assert status >= 400
            wire.append((f"{shape}_error", raw.decode()))
    return wire


def test_wire_shapes_reserialize_identically_through_vllms_models(vllm):
    with sim_pair(startup_timeout=90.0) as (p, d):
        wire = _collect(p, d)
    again = vllm({"wire": wire})["wire"]
    differ = [(kind, ours, theirs) for (kind, ours), theirs in zip(wire, again, strict=True) if ours != theirs]
    assert not differ, "\n\n".join(f"{k}\n sim:  {o}\n vllm: {t}" for k, o, t in differ[:6])

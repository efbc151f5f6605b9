"""POST /v1/responses (OpenAI Responses API) as vLLM 0.33 serves it for a non-Harmony model
(vllm/entrypoints/openai/responses/: protocol.py, serving.py, utils.py, streaming_events.py).

A request reads top to bottom as in OpenAIServingResponses._create_responses:
  1. the body is validated (ResponsesRequest and its before-validators);
  2. the model is checked; background mode is refused (vLLM's store is off unless VLLM_ENABLE_RESPONSES_API_STORE,
     so `store` is silently dropped and every `previous_response_id` is 404);
  3. `instructions` + `input` become chat messages (utils.construct_input_messages), function tools become chat
     tools, and the prompt is rendered from what vLLM's parse keeps of them (chat_parse), with
     continue_final_message when the last item is an unfinished assistant message;
  4. length rules, then one request through the engine core (serving.generation): the P-D protocol follows the
     request's `kv_transfer_params`;
  5. the answer: a ResponsesResponse whose top-level `kv_transfer_params` carries the engine's params, or a stream
     of events whose response objects carry null until the terminal response.completed/response.incomplete.
The simulator never calls tools: replies are one assistant message of output_text.
"""

from __future__ import annotations

import json
import time
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from duplex_sidecars.protocol import KV_PARAMS_FIELD
from duplex_sidecars.sim import generation as gen
from duplex_sidecars.sim.chat_parse import parse_messages
from duplex_sidecars.sim.chat_template import TemplateError, render_conversation
from duplex_sidecars.sim.engine import Engine, GenerationRequest, Running
from duplex_sidecars.sim.kv_blocks import OutOfBlocks
from duplex_sidecars.sim.serving import (
    GenerationFailed,
    check_max_tokens,
    check_prompt_fits,
    cut,
    decode_all,
    generation,
    kv_params,
    open_stream,
    random_uuid,
    reported_cached_tokens,
    sampled_max_tokens,
    sse,
    trace_headers,
)
from duplex_sidecars.sim.validation import (
    Fields,
    RequestError,
    invalid,
    json_response,
    openai_error,
    read_json_object,
)

_STATUSES = ("in_progress", "completed", "incomplete")
_INPUT_PART_TYPES = ("input_text", "input_image", "input_file")
_INCLUDABLE = (
    "code_interpreter_call.outputs",
    "computer_call_output.output.image_url",
    "file_search_call.results",
    "message.input_image.image_url",
    "message.output_text.logprobs",
    "reasoning.encrypted_content",
)
# The echo of a function tool in the response (openai.types.responses.FunctionTool, field order kept).
_FUNCTION_TOOL_FIELDS = (
    "name",
    "parameters",
    "strict",
    "type",
    "allowed_callers",
    "async",
    "defer_loading",
    "description",
    "output_schema",
)


# -- 1. the request ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Item:
    """One input item as vLLM's validation leaves it. `kind` names the type pydantic picked: "output_message" is
    an assistant message with a list of output parts (openai's ResponseOutputMessage, which vLLM completes with id,
    status and annotations), "message" any other message (a plain dict), "other" an item type with no conversion."""

    kind: str
    data: dict[str, Any]


@dataclass
class ResponsesRequest:
    body: dict[str, Any]
    input: str | list[Item]
    request_id: str
    instructions: str | None = None
    max_output_tokens: int | None = None
    model: str | None = None
    stream: bool = False
    store: bool = True
    background: bool = False
    previous_response_id: str | None = None
    previous_input_messages: list[Any] | None = None
    tools: list[dict[str, Any]] = field(default_factory=list)
    tool_choice: Any = "auto"
    temperature: float | None = None
    top_p: float | None = None
    top_logprobs: int = 0
    include: list[str] | None = None
    ignore_eos: bool = False
    kv_transfer_params: dict[str, Any] | None = None
    parallel_tool_calls: bool = True
    presence_penalty: float | None = None
    frequency_penalty: float | None = None

    @property
    def logprobs(self) -> int | None:
        """SamplingParams.logprobs: asked for only through `include`."""
        return self.top_logprobs if self.include and "message.output_text.logprobs" in self.include else None


def parse_request(body: dict[str, Any]) -> ResponsesRequest:
    """ResponsesRequest's validation. Its before-validators run first (the last defined first) and raise
    VLLMValidationError past pydantic; then field errors are reported together."""
    _check_tool_usage(body)
    for tool in body.get("tools") or []:
        grammar = isinstance(tool, dict) and isinstance(tool.get("format"), dict) and tool["format"].get("type")
        if isinstance(tool, dict) and tool.get("type") == "custom" and grammar == "grammar":
            raise invalid(
                "Custom tools with a grammar format are not supported; only free-form text custom tools are accepted.",
                "tools",
            )
    if body.get("prompt") is not None:
        raise invalid("prompt template is not supported", "prompt")
    if body.get("background") and not body.get("store", True):
        raise invalid("background can only be used when `store` is true", "background")

    # Fields in ResponsesRequest's order, which is the order pydantic reports their errors in.
    f = Fields(body)
    background = bool(f.boolean("background", False))
    include = _include(f)
    items: str | list[Item] = ""
    if f.required("input"):
        value = body["input"]
        if isinstance(value, str):
            items = value
        elif isinstance(value, list):
            since = len(f.errors)
            items = [i for i in (_item(f, n, v) for n, v in enumerate(value)) if i is not None]
            f.string_branch_failed(since, ("input",), value)
        else:
            f.fail(("input",), "string_type", "Input should be a valid string", value)
            f.fail(("input",), "list_type", "Input should be a valid list", value)
    instructions = f.string("instructions")
    max_output_tokens = f.integer("max_output_tokens")
    f.integer("max_tool_calls")
    f.mapping("metadata")
    model = f.string("model")
    parallel_tool_calls = f.boolean("parallel_tool_calls", True) is not False
    previous_response_id = f.string("previous_response_id")
    f.mapping("reasoning")
    f.literal("service_tier", ("auto", "default", "flex", "scale", "priority"), "auto", nullable=False)
    store = bool(f.boolean("store", True))
    stream = bool(f.boolean("stream", False))
    temperature = f.number("temperature")
    f.mapping("text")
    tools = _tools(f)
    top_logprobs = f.integer("top_logprobs", 0, nullable=False) or 0
    top_p = f.number("top_p")
    f.literal("truncation", ("auto", "disabled"), "disabled")
    f.string("user")
    presence_penalty, frequency_penalty = _penalty(f, "presence_penalty"), _penalty(f, "frequency_penalty")
    f.string("prompt_cache_key")
    f.mapping("prompt_cache_options")
    if body.get("prompt_cache_retention") != "in-memory":  # the spelling of older SDKs, normalized
        f.literal("prompt_cache_retention", ("in_memory", "24h"))
    f.string("safety_identifier")
    request_id = f.string("request_id", None, nullable=False) if "request_id" in body else f"resp_{random_uuid()}"
    if "cache_salt" in body:
        salt = f.string("cache_salt")
        if salt is not None and not 1 <= len(salt) <= 1024:
            f.fail(
                ("cache_salt",),
                "string_too_short" if not salt else "string_too_long",
                "String should have at least 1 character" if not salt else "String should have at most 1024 characters",
                salt,
            )
    previous_input_messages = f.array("previous_input_messages")
    ignore_eos = bool(f.boolean("ignore_eos", False, nullable=False))
    params = f.mapping(KV_PARAMS_FIELD)
    f.mapping("chat_template_kwargs")
    req = ResponsesRequest(
        body=body,
        input=items,
        request_id=request_id,
        instructions=instructions,
        max_output_tokens=max_output_tokens,
        model=model,
        stream=stream,
        store=store,
        background=background,
        previous_response_id=previous_response_id,
        previous_input_messages=previous_input_messages,
        tools=tools,
        tool_choice=body.get("tool_choice", "auto"),
        temperature=temperature,
        top_p=top_p,
        top_logprobs=top_logprobs,
        include=include,
        ignore_eos=ignore_eos,
        kv_transfer_params=params,
        parallel_tool_calls=parallel_tool_calls,
        presence_penalty=presence_penalty,
        frequency_penalty=frequency_penalty,
    )
    f.check()
    return req


def _check_tool_usage(body: dict[str, Any]) -> None:
    """check_tool_usage: tool_choice needs tools, and without tools "auto" becomes "none"."""
    tools = body.get("tools")
    choice = body.get("tool_choice", "auto")
    named = isinstance(choice, dict) and choice.get("type") in ("function", "custom")
    if not tools:
        if choice in ("auto", "none"):
            body["tool_choice"] = "none"
        elif choice == "required":
            raise invalid("Tool choice 'required' must be specified with 'tools' parameter.", "tool_choice")
        elif named:
            raise invalid("Tool choice 'function' not found in 'tools' parameter.", "tool_choice")
    elif named and isinstance(tools, list):
        names = {t.get("name") for t in tools if isinstance(t, dict)}
        if not choice.get("name") or choice["name"] not in names:
            raise invalid("Tool choice 'function' not found in 'tools' parameter.", "tool_choice")


def _penalty(f: Fields, name: str) -> float | None:
    value = f.number(name)
    if value is not None and not -2.0 <= value <= 2.0:
        bound = (
            ("greater_than_equal", "greater than or equal to -2")
            if value < -2
            else ("less_than_equal", "less than or equal to 2")
        )
        f.fail((name,), bound[0], f"Input should be {bound[1]}", f.raw(name))
        return None
    return float(value) if value is not None else None


def _include(f: Fields) -> list[str] | None:
    values = f.array("include")
    for n, value in enumerate(values or []):
        if value not in _INCLUDABLE:
            f.fail(("include", n), "literal_error", "Input should be one of the includable values", value)
    return list(values) if values is not None else None


def _tools(f: Fields) -> list[dict[str, Any]]:
    """Function tools, validated as openai's FunctionTool. The simulator renders no other tool type (vLLM turns
    custom and namespace tools into functions and drops built-in ones); it refuses them rather than differ."""
    tools = f.array("tools", [], nullable=False) or []
    out = []
    for n, tool in enumerate(tools):
        if not isinstance(tool, dict):
            f.fail(("tools", n), "model_type", "Input should be a valid dictionary or instance of Tool", tool)
            continue
        if tool.get("type") != "function":
            raise invalid(f"the simulator serves only function tools, not {tool.get('type')!r}", "tools")
        if not isinstance(tool.get("name"), str):
            f.fail(
                ("tools", n, "function", "name"),
                "missing" if "name" not in tool else "string_type",
                "Field required" if "name" not in tool else "Input should be a valid string",
                tool,
            )
            continue
        if tool.get("parameters") is not None and not isinstance(tool["parameters"], dict):
            f.fail(
                ("tools", n, "function", "parameters"),
                "dict_type",
                "Input should be a valid dictionary",
                tool["parameters"],
            )
            continue
        out.append(tool)
    return out


def _item(f: Fields, n: int, item: Any) -> Item | None:
    """One input item through ResponsesRequest.input_item_parsing and pydantic's union of item types."""
    loc = ("input", n)
    if not isinstance(item, dict):
        f.fail(loc, "model_type", "Input should be a valid dictionary or object", item)
        return None
    kind = item.get("type")
    if kind == "function_call":
        return _checked(
            f, loc, item, "function_call", str_fields=("arguments", "call_id", "name"), optional_str=("id", "namespace")
        )
    if kind == "reasoning":
        return _reasoning(f, loc, item)
    if kind in ("function_call_output", "custom_tool_call_output"):
        if "output" not in item:
            f.fail((*loc, "output"), "missing", "Field required", item)
            return None
        if kind == "custom_tool_call_output" and not isinstance(item.get("call_id"), str):
            f.fail((*loc, "call_id"), "missing", "Field required", item)
            return None
        return Item(kind, dict(item))
    if kind == "custom_tool_call":
        return _checked(f, loc, item, "custom_tool_call", str_fields=("call_id", "input", "name"))
    if kind == "message" or (kind is None and "role" in item):
        return _message(f, loc, item)
    if kind == "item_reference" or (kind is None and "id" in item):
        return Item("other", dict(item))
    if isinstance(kind, str) and "role" not in item:
        return Item("other", dict(item))  # a valid item vLLM cannot convert (the conversion answers 400)
    f.fail(loc, "union_tag_invalid", "Input tag does not match any of the expected item types", item)
    return None


def _checked(
    f: Fields,
    loc: tuple[Any, ...],
    item: dict[str, Any],
    kind: str,
    str_fields: tuple[str, ...],
    optional_str: tuple[str, ...] = (),
) -> Item | None:
    ok = True
    for name in str_fields:
        if not isinstance(item.get(name), str):
            f.fail(
                (*loc, name),
                "missing" if name not in item else "string_type",
                "Field required" if name not in item else "Input should be a valid string",
                item,
            )
            ok = False
    for name in optional_str:
        if item.get(name) is not None and not isinstance(item[name], str):
            f.fail((*loc, name), "string_type", "Input should be a valid string", item[name])
            ok = False
    if item.get("status") is not None and item["status"] not in _STATUSES:
        f.fail(
            (*loc, "status"),
            "literal_error",
            "Input should be 'in_progress', 'completed' or 'incomplete'",
            item["status"],
        )
        ok = False
    return Item(kind, dict(item)) if ok else None


def _reasoning(f: Fields, loc: tuple[Any, ...], item: dict[str, Any]) -> Item | None:
    """ResponseReasoningItem: a `summary` list is required (vLLM adds the id)."""
    summary, content = item.get("summary"), item.get("content")
    if not isinstance(summary, list):
        f.fail(
            (*loc, "summary"),
            "missing" if "summary" not in item else "list_type",
            "Field required" if "summary" not in item else "Input should be a valid list",
            item,
        )
        return None
    texts = [(s, "summary_text") for s in summary] + [(c, "reasoning_text") for c in content or []]
    if content is not None and not isinstance(content, list):
        f.fail((*loc, "content"), "list_type", "Input should be a valid list", content)
        return None
    for part, kind in texts:
        if not (isinstance(part, dict) and isinstance(part.get("text"), str) and part.get("type") == kind):
            f.fail(
                (*loc, "summary" if kind == "summary_text" else "content"),
                "model_type",
                f"Input should be a {kind} part",
                part,
            )
            return None
    if item.get("encrypted_content") is not None and not isinstance(item["encrypted_content"], str):
        f.fail((*loc, "encrypted_content"), "string_type", "Input should be a valid string", item)
        return None
    data = {"id": f"rs_{random_uuid()}", **item}
    return Item("reasoning", data)


def _message(f: Fields, loc: tuple[Any, ...], item: dict[str, Any]) -> Item | None:
    role, content = item.get("role"), item.get("content")
    if role not in ("user", "assistant", "system", "developer"):
        f.fail((*loc, "role"), "literal_error", "Input should be 'user', 'assistant', 'system' or 'developer'", role)
        return None
    if "content" not in item:
        f.fail((*loc, "content"), "missing", "Field required", item)
        return None
    if role == "assistant" and item.get("type") == "message" and isinstance(content, list):
        output = _output_message(item)
        if output is not None:
            return Item("output_message", output)
    if isinstance(content, str):
        return Item("message", dict(item))
    if not isinstance(content, list):
        f.fail((*loc, "content"), "string_type", "Input should be a valid string", content)
        return None
    for m, part in enumerate(content):
        if not (isinstance(part, dict) and part.get("type") in _INPUT_PART_TYPES):
            f.fail(
                (*loc, "content", m),
                "union_tag_invalid",
                "Input tag does not match 'input_text', 'input_image' or 'input_file'",
                part,
            )
            return None
        if part["type"] == "input_text" and not isinstance(part.get("text"), str):
            f.fail((*loc, "content", m, "text"), "missing", "Field required", part)
            return None
    return Item("message", dict(item))


def _output_message(item: dict[str, Any]) -> dict[str, Any] | None:
    """input_item_parsing's ResponseOutputMessage: id, status "completed" and empty annotations filled in; None
    when the parts are not all output_text/refusal (pydantic then tries the other message types)."""
    parts = []
    for part in item["content"]:
        if not isinstance(part, dict):
            return None
        if part.get("type") == "output_text" and isinstance(part.get("text"), str):
            parts.append({"annotations": [], **part})
        elif part.get("type") == "refusal" and isinstance(part.get("refusal"), str):
            parts.append(dict(part))
        else:
            return None
    status = item.get("status", "completed")
    if status not in _STATUSES or not isinstance(item.get("id", ""), str):
        return None
    return {"id": f"msg_{random_uuid()}", **item, "status": status, "content": parts}


# -- 3. conversion to chat messages and the prompt ----------------------------------------------------------------
def input_messages(instructions: str | None, items: str | list[Item]) -> list[dict[str, Any]]:
    """utils.construct_input_messages without stored history: the instructions as a system message, then the
    input (a string is one user message)."""
    messages: list[dict[str, Any]] = []
    if instructions:
        messages.append({"role": "system", "content": instructions})
    if isinstance(items, str):
        messages.append({"role": "user", "content": items})
        return messages
    converted: list[dict[str, Any]] = []
    for item in items:
        message = _message_from_item(item, converted[-1] if converted else None)
        if message is not None:
            converted.append(message)
    return messages + converted


def _message_from_item(item: Item, prev: dict[str, Any] | None) -> dict[str, Any] | None:
    """utils._construct_message_from_response_item: a new chat message, or None after folding the item into the
    previous assistant message (a tool call joins its tool_calls, reasoning or text fills what it lacks)."""
    prev_assistant = prev if prev is not None and prev.get("role") == "assistant" else None
    data = item.data
    call = None
    if item.kind == "function_call":
        name = f"{data['namespace']}__{data['name']}" if data.get("namespace") else data["name"]
        call = {"id": data["call_id"], "function": {"name": name, "arguments": data["arguments"]}, "type": "function"}
    elif item.kind == "custom_tool_call":
        arguments = json.dumps({"input": data.get("input") or ""}, ensure_ascii=False)
        call = {"id": data["call_id"], "function": {"name": data["name"], "arguments": arguments}, "type": "function"}
    if call is not None:
        if prev_assistant is not None:
            prev_assistant.setdefault("tool_calls", []).append(call)
            return None
        return {"role": "assistant", "tool_calls": [call]}
    if item.kind == "reasoning":
        if data.get("encrypted_content"):
            raise invalid("Encrypted content is not supported.", "input")
        reasoning = (
            data["content"][0]["text"]
            if data.get("content")
            else (data["summary"][0]["text"] if data["summary"] else "")
        )
        if prev_assistant is not None and prev_assistant.get("reasoning") is None:
            prev_assistant["reasoning"] = reasoning
            return None
        return {"role": "assistant", "reasoning": reasoning}
    if item.kind == "output_message":
        if not data["content"]:
            raise RequestError(500, "list index out of range", "InternalServerError")  # vLLM indexes content[0]
        first = data["content"][0]
        if "text" not in first:
            raise RequestError(500, "'ResponseOutputRefusal' object has no attribute 'text'", "InternalServerError")
        return _assistant_text(first["text"], prev_assistant)
    if item.kind in ("function_call_output", "custom_tool_call_output"):
        return {"role": "tool", "content": data.get("output"), "tool_call_id": data.get("call_id")}
    if item.kind == "message" and data.get("role") == "assistant":
        content = data.get("content")
        text = content if isinstance(content, str) else content[0].get("text") if content else None
        if text is not None:
            return _assistant_text(text, prev_assistant)
    if item.kind == "message":
        return dict(data)
    raise invalid(f"Unsupported input item type: {data.get('type')}", "input")


def _assistant_text(text: str, prev_assistant: dict[str, Any] | None) -> dict[str, Any] | None:
    if prev_assistant is not None and prev_assistant.get("content") is None:
        prev_assistant["content"] = text
        return None
    return {"role": "assistant", "content": text}


def tool_dicts(tools: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """utils.construct_tool_dicts: each function tool as a chat tool (FunctionDefinition drops a null strict or
    defer_loading)."""
    if not tools:
        return None
    out = []
    for tool in tools:
        function: dict[str, Any] = {
            "name": tool["name"],
            "description": tool.get("description"),
            "parameters": tool.get("parameters"),
        }
        for key in ("strict", "defer_loading"):
            if tool.get(key) is not None:
                function[key] = tool[key]
        out.append({"type": "function", "function": function})
    return out


def continues_final_message(items: str | list[Item]) -> bool:
    """utils.should_continue_final_message: an unfinished assistant message (or reasoning) at the end is continued
    instead of starting a new turn."""
    if isinstance(items, str) or not items:
        return False
    last = items[-1]  # any message counts, a user's too: vLLM looks at the status only
    return last.kind in ("output_message", "reasoning", "message") and last.data.get("status") in (
        "in_progress",
        "incomplete",
    )


def render_prompt(req: ResponsesRequest, max_model_len: int) -> list[int]:
    """The prompt tokens: what vLLM's parse keeps of the converted messages, rendered by the simulator's template
    (after the renderer's check of the output cap, TokenizeParams)."""
    messages = input_messages(req.instructions, req.input)
    if req.max_output_tokens is not None and req.max_output_tokens > max_model_len:
        raise invalid(
            f"max_output_tokens={req.max_output_tokens} cannot be greater than max_model_len="
            f"{max_model_len}. Please request fewer output tokens.",
            "max_output_tokens",
            req.max_output_tokens,
        )
    cont = continues_final_message(req.input)
    try:
        return render_conversation(parse_messages(messages), tool_dicts(req.tools), not cont, cont)
    except TemplateError as e:
        raise RequestError(400, str(e), "BadRequestError") from e


# -- 5. the answer --------------------------------------------------------------------------------------------------
@dataclass
class ResponseBuilder:
    """ResponsesResponse.from_request and the simple streaming processor's events for one request."""

    req: ResponsesRequest
    model: str
    max_tokens: int
    created_at: int = field(default_factory=lambda: int(time.time()))
    message_id: str = field(default_factory=lambda: f"msg_{random_uuid()}")

    def response(
        self, status: str, output: list[dict[str, Any]], usage: dict[str, Any] | None, params: dict[str, Any] | None
    ) -> dict[str, Any]:
        req, body = self.req, self.req.body
        temperature = 1.0 if req.temperature is None else float(req.temperature)
        top_p = 1.0 if req.top_p is None or temperature < 1e-5 else float(req.top_p)  # greedy resets top_p
        options = body.get("prompt_cache_options")
        if options is not None:
            options = {
                "mode": options.get("mode", "implicit"),
                "ttl": options.get("ttl", "30m"),
                "comparison_response_id": options.get("comparison_response_id"),
            }
        retention = body.get("prompt_cache_retention")
        return {
            "id": req.request_id,
            "created_at": self.created_at,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": req.instructions,
            "metadata": body.get("metadata"),
            "model": self.model,
            "object": "response",
            "output": output,
            "parallel_tool_calls": req.parallel_tool_calls,
            "temperature": temperature,
            "tool_choice": _echo_tool_choice(body.get("tool_choice", "auto")),
            "tools": [_echo_tool(t) for t in req.tools],
            "top_p": top_p,
            "background": req.background,
            "max_output_tokens": self.max_tokens,
            "max_tool_calls": body.get("max_tool_calls"),
            "previous_response_id": req.previous_response_id,
            "prompt": None,
            "prompt_cache_options": options,
            "prompt_cache_key": body.get("prompt_cache_key"),
            "prompt_cache_retention": "in_memory" if retention == "in-memory" else retention,
            "reasoning": _echo_reasoning(body.get("reasoning")),
            "safety_identifier": body.get("safety_identifier"),
            "service_tier": body.get("service_tier", "auto"),
            "status": status,
            "text": _echo_text(body.get("text")),
            "top_logprobs": req.logprobs,
            "truncation": body.get("truncation", "disabled"),
            "usage": usage,
            "user": body.get("user"),
            "presence_penalty": float(req.presence_penalty or 0.0),
            "frequency_penalty": float(req.frequency_penalty or 0.0),
            KV_PARAMS_FIELD: params,
            "ec_transfer_params": None,
            "input_messages": None,
            "output_messages": None,
        }

    def message(self, text: str, status: str) -> dict[str, Any]:
        content = [self.text_part(text, None)] if text else []
        return {
            "id": self.message_id,
            "content": content,
            "role": "assistant",
            "status": status,
            "type": "message",
            "phase": None,
        }

    @staticmethod
    def text_part(text: str, logprobs: list[Any] | None) -> dict[str, Any]:
        return {"annotations": [], "text": text, "type": "output_text", "logprobs": logprobs}

    @staticmethod
    def usage(run: Running) -> dict[str, Any]:
        prompt, output = len(run.req.prompt), len(run.output)
        return {
            "input_tokens": prompt,
            "input_tokens_details": {
                "cached_tokens": reported_cached_tokens(run),
                "cache_write_tokens": run.num_cache_creation_tokens,
                "input_tokens_per_turn": [],
                "cached_tokens_per_turn": [],
            },
            "output_tokens": output,
            "output_tokens_details": {
                "reasoning_tokens": 0,
                "tool_output_tokens": 0,
                "output_tokens_per_turn": [],
                "tool_output_tokens_per_turn": [],
            },
            "total_tokens": prompt + output,
        }


def _echo_tool(tool: dict[str, Any]) -> dict[str, Any]:
    return {k: tool.get(k) for k in _FUNCTION_TOOL_FIELDS}


def _echo_tool_choice(value: Any) -> Any:
    """A named choice is one of openai's ToolChoice models, whose fields are declared alphabetically."""
    return dict(sorted(value.items())) if isinstance(value, dict) else value


def _echo_reasoning(value: Any) -> Any:
    if not isinstance(value, dict):
        return value
    return {k: value.get(k) for k in ("context", "effort", "generate_summary", "mode", "summary")}


def _echo_text(value: Any) -> Any:
    if not isinstance(value, dict):
        return value
    return {"format": value.get("format"), "verbosity": value.get("verbosity")}


def status_of(finish_reason: str) -> str:
    """The response's status and its last item's (utils.response_item_status)."""
    return "incomplete" if finish_reason == "length" else "completed"


# -- the route ------------------------------------------------------------------------------------------------------
class ResponsesRoute:
    def __init__(self, engine: Engine):
        self.engine = engine
        self.model = engine.cfg.model
        self.max_model_len = engine.cfg.max_model_len

    def add_to(self, app: web.Application) -> None:
        app.router.add_post("/v1/responses", self.create)
        app.router.add_get("/v1/responses/{response_id}", self.retrieve)
        app.router.add_post("/v1/responses/{response_id}/cancel", self.retrieve)

    async def retrieve(self, request: web.Request) -> web.Response:
        """Nothing is ever stored: retrieve and cancel find no response."""
        return openai_error(_not_found(request.match_info["response_id"]))

    async def create(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await read_json_object(request)  # 1.
            req = parse_request(body)
            # 2.
            if req.model and req.model != self.model:
                raise RequestError(
                    404,
                    f"The model `{req.model}` does not exist. Valid aliases: {self.model}.",
                    "NotFoundError",
                    "model",
                )
            if req.store and req.background:
                raise RequestError(
                    400,
                    "This vLLM engine does not support `store=True` and therefore does not "
                    "support the background mode. To enable these features, set the environment "
                    "variable `VLLM_ENABLE_RESPONSES_API_STORE=1` when launching the vLLM server.",
                    "invalid_request_error",
                    "background",
                )
            if req.previous_input_messages and req.previous_response_id:
                raise RequestError(
                    400,
                    "Only one of `previous_input_messages` and `previous_response_id` can be set.",
                    "invalid_request_error",
                    "previous_response_id",
                )
            if req.previous_response_id is not None:
                raise _not_found(req.previous_response_id)
            # 3.
            prompt = render_prompt(req, self.max_model_len)
            # 4.
            check_prompt_fits(len(prompt), self.max_model_len)
            if len(prompt) >= self.max_model_len:
                raise RequestError(
                    400,
                    f"The engine prompt length {len(prompt)} exceeds the max_model_len "
                    f"{self.max_model_len}. Please reduce prompt.",
                    "invalid_request_error",
                    "input",
                )
            max_tokens = sampled_max_tokens(self.max_model_len, req.max_output_tokens, len(prompt))
            check_max_tokens(max_tokens)
            return await self._generate(request, req, prompt, max_tokens)
        except RequestError as e:
            return openai_error(e)

    async def _generate(
        self, request: web.Request, req: ResponsesRequest, prompt: list[int], max_tokens: int
    ) -> web.StreamResponse:
        greq = GenerationRequest(
            request_id=f"{req.request_id}_0-{random_uuid()[:8]}",
            prompt=prompt,
            max_tokens=max_tokens,
            ignore_eos=req.ignore_eos,
            kv_params=kv_params(req.kv_transfer_params),
            trace_headers=trace_headers(request.headers),
        )
        out = ResponseBuilder(req, self.model, max_tokens)
        try:
            async with generation(self.engine, greq) as run:
                if req.stream:
                    return await self._stream(request, run, out)
                await decode_all(self.engine, run)
        except GenerationFailed:
            if req.stream:
                return await self._failed_stream(request, out)
            return openai_error(RequestError(500, GenerationFailed.message, "InternalServerError"))
        except OutOfBlocks as e:
            return openai_error(RequestError(503, str(e), "ServiceUnavailableError"))
        status = status_of(run.finish_reason)
        text = gen.chat_text(run.output)
        body = out.response(status, [out.message(text, status)], out.usage(run), run.kv_params_out)
        return json_response(body)

    async def _stream(self, request: web.Request, run: Running, out: ResponseBuilder) -> web.StreamResponse:
        """responses_stream_generator with the simple (non-Harmony) processor: one output message, opened by its
        first non-empty delta."""
        resp = await open_stream(request)
        events = _Events(out)
        initial = out.response("in_progress", [], None, None)
        await resp.write(
            events.lifecycle("response.created", initial) + events.lifecycle("response.in_progress", initial)
        )
        text = ""
        try:
            async with aclosing(self.engine.decode(run)) as tokens:
                async for i, tok in _enumerate(tokens):
                    delta = gen.chat_delta(i, tok)
                    if delta:  # the EOS token's empty text emits nothing
                        await resp.write((events.opened() if not text else b"") + events.delta(delta))
                        text += delta
        except OutOfBlocks:
            cut(request)  # vLLM's generator raises mid-stream and uvicorn drops the connection
            return resp
        status = status_of(run.finish_reason)
        output = [out.message(text, status)] if text else []
        closing = events.closed(output[0]) if output else b""
        final = out.response(status, output, out.usage(run), run.kv_params_out)
        terminal = "response.incomplete" if status == "incomplete" else "response.completed"
        await resp.write(closing + events.lifecycle(terminal, final))
        await resp.write_eof()
        return resp

    async def _failed_stream(self, request: web.Request, out: ResponseBuilder) -> web.StreamResponse:
        """A generation error after the stream began: vLLM sends created/in_progress, then its attempt to frame the
        error as an event fails validation and the connection drops."""
        resp = await open_stream(request)
        events = _Events(out)
        initial = out.response("in_progress", [], None, None)
        await resp.write(
            events.lifecycle("response.created", initial) + events.lifecycle("response.in_progress", initial)
        )
        cut(request)
        return resp


class _Events:
    """The events of one stream (streaming_events.py's simple content state), numbered from 0. openai's event models
    declare their fields alphabetically and model_dump_json keeps that order; nested items keep theirs."""

    def __init__(self, out: ResponseBuilder):
        self.out = out
        self.n = 0

    def _event(self, kind: str, fields: dict[str, Any]) -> bytes:
        data = dict(sorted({**fields, "sequence_number": self.n, "type": kind}.items()))
        self.n += 1
        return sse(kind, data)

    def lifecycle(self, kind: str, response: dict[str, Any]) -> bytes:
        return self._event(kind, {"response": response})

    def opened(self) -> bytes:
        """emit_simple_content_open: the message item in progress and its empty text part."""
        item_id = self.out.message_id
        item: dict[str, Any] = {
            "id": item_id,
            "content": [],
            "role": "assistant",
            "status": "in_progress",
            "type": "message",
            "phase": None,
        }
        part = self.out.text_part("", [])
        return self._event("response.output_item.added", {"item": item, "output_index": 0}) + self._event(
            "response.content_part.added", {"content_index": 0, "item_id": item_id, "output_index": 0, "part": part}
        )

    def delta(self, text: str) -> bytes:
        return self._event(
            "response.output_text.delta",
            {"content_index": 0, "delta": text, "item_id": self.out.message_id, "logprobs": [], "output_index": 0},
        )

    def closed(self, item: dict[str, Any]) -> bytes:
        """emit_simple_content_done: the text, the part and the item, finished."""
        where = {"content_index": 0, "item_id": item["id"], "output_index": 0}
        return (
            self._event("response.output_text.done", {**where, "logprobs": [], "text": item["content"][0]["text"]})
            + self._event("response.content_part.done", {**where, "part": item["content"][0]})
            + self._event("response.output_item.done", {"item": item, "output_index": 0})
        )


def _not_found(response_id: str) -> RequestError:
    return RequestError(404, f"Response with id '{response_id}' not found.", "invalid_request_error", "response_id")


async def _enumerate(it: Any) -> Any:
    i = 0
    async for x in it:
        yield i, x
        i += 1

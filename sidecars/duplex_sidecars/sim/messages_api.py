"""POST /v1/messages (Anthropic Messages API) as vLLM 0.33 serves it (vllm/entrypoints/anthropic/: protocol.py,
serving.py, api_router.py): the request becomes a chat completion request and runs through the chat path.

A request reads top to bottom as in AnthropicServingMessages.create_messages:
  1. the body is validated (AnthropicMessagesRequest); failures get the app's OpenAI-shaped 400, like every
     pydantic failure in vLLM; from here on, errors are answered in Anthropic's shape;
  2. `system` and `messages` become chat messages (_convert_system_message, _convert_messages), tools become chat
     tools, `max_tokens` both chat caps; the prompt is rendered from what vLLM's parse keeps of them (chat_parse);
  3. the model and length rules of the chat path, then one request through the engine core (serving.generation):
     the P-D protocol follows `kv_transfer_params`;
  4. the answer: messages_full_converter keeps the chat response's top-level `kv_transfer_params` (dropped when null,
     as the route dumps with exclude_none), while message_stream_converter turns the chat chunks into
     message_start ... message_stop and never copies kv_transfer_params: a streamed Messages reply carries none.
The simulator's chat template accepts system messages anywhere, so (like vLLM with such a template) inline system
messages are not merged into the leading one. It never calls tools: replies are one text block.
"""

from __future__ import annotations

import json
import time
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from duplex_sidecars.protocol import KV_PARAMS_FIELD
from duplex_sidecars.sim import generation as gen
from duplex_sidecars.sim.chat_parse import BILLING_HEADER, parse_messages
from duplex_sidecars.sim.chat_template import TemplateError, render_conversation
from duplex_sidecars.sim.engine import Engine, GenerationRequest, Running
from duplex_sidecars.sim.kv_blocks import OutOfBlocks
from duplex_sidecars.sim.serving import (
    GenerationFailed,
    check_max_tokens,
    check_prompt_fits,
    decode_all,
    generation,
    kv_params,
    open_stream,
    random_uuid,
    sampled_max_tokens,
    sse,
    trace_headers,
)
from duplex_sidecars.sim.validation import (
    FieldError,
    Fields,
    RequestError,
    invalid,
    json_response,
    openai_error,
    read_json_object,
    validation_failed,
)

_ROLES = ("user", "assistant", "system")
_TOOL_CHANGES = ("tool_addition", "tool_removal")
_BLOCK_TYPES = (
    "text",
    "image",
    "tool_use",
    "tool_result",
    "tool_reference",
    "thinking",
    "redacted_thinking",
    "tool_addition",
    "tool_removal",
)
# AnthropicContentBlock's typed fields (str | None unless listed).
_BLOCK_DICT_FIELDS = ("source", "input")
_BLOCK_STR_FIELDS = ("text", "id", "tool_use_id", "name", "tool_name", "thinking", "signature", "data")
# Anthropic SDKs dispatch on error.type (protocol._ANTHROPIC_ERROR_TYPE_BY_STATUS).
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}


def error_type(status: int) -> str:
    """protocol.translate_error_type."""
    return _ERROR_TYPES.get(status) or ("api_error" if status >= 500 else "invalid_request_error")


def anthropic_error(error: RequestError) -> web.Response:
    """api_router.translate_error_response."""
    body = {"type": "error", "error": {"type": error_type(error.status), "message": error.message}}
    return json_response(body, error.status)


# -- 1. the request ---------------------------------------------------------------------------------------------
@dataclass
class MessagesRequest:
    body: dict[str, Any]
    model: str
    messages: list[dict[str, Any]]
    max_tokens: int
    system: str | list[dict[str, Any]] | None
    tools: list[dict[str, Any]] | None
    tool_choice: dict[str, Any] | None
    stream: bool
    kv_transfer_params: dict[str, Any] | None


def parse_request(body: dict[str, Any]) -> MessagesRequest:
    """AnthropicMessagesRequest's validation (a plain BaseModel: unknown fields are ignored)."""
    # Fields in AnthropicMessagesRequest's order, which is the order pydantic reports their errors in.
    f = Fields(body)
    model = f.string("model", nullable=False) if f.required("model") else None
    if model == "":
        f.fail(
            ("model",),
            "value_error",
            "Value error, Model is required",
            model,
            {"error": ValueError("Model is required")},
        )
    messages = f.array("messages", nullable=False) if f.required("messages") else None
    for n, message in enumerate(messages or []):
        _message(f, ("messages", n), message)
    max_tokens = f.integer("max_tokens", nullable=False) if f.required("max_tokens") else None
    if max_tokens is not None and max_tokens <= 0:
        f.fail(
            ("max_tokens",),
            "value_error",
            "Value error, max_tokens must be positive",
            max_tokens,
            {"error": ValueError("max_tokens must be positive")},
        )
    f.mapping("metadata")
    f.mapping("output_config")
    thinking = _thinking(f)
    stops = f.array("stop_sequences")
    for n, stop in enumerate(stops or []):
        if not isinstance(stop, str):
            f.fail(("stop_sequences", n), "string_type", "Input should be a valid string", stop)
    stream = bool(f.boolean("stream", False))
    system = body.get("system")
    if isinstance(system, list):
        since = len(f.errors)
        _blocks(f, ("system",), system)
        f.string_branch_failed(since, ("system",), system)
    elif system is not None and not isinstance(system, str):
        f.fail(("system",), "string_type", "Input should be a valid string", system)
    f.number("temperature")
    tool_choice = f.mapping("tool_choice")
    if tool_choice is not None:
        if tool_choice.get("type") not in ("auto", "any", "tool", "none"):
            f.fail(
                ("tool_choice", "type"),
                "literal_error",
                "Input should be 'auto', 'any', 'tool' or 'none'",
                tool_choice.get("type"),
            )
        elif tool_choice["type"] == "tool" and not tool_choice.get("name"):
            f.fail(
                ("tool_choice",),
                "value_error",
                "Value error, tool_choice.name is required when type is 'tool'",
                tool_choice,
                {"error": ValueError("tool_choice.name is required when type is 'tool'")},
            )
    tools = f.array("tools")
    for n, tool in enumerate(tools or []):
        _tool(f, ("tools", n), tool)
    f.integer("top_k")
    f.number("top_p")
    params = f.mapping(KV_PARAMS_FIELD)
    f.mapping("vllm_xargs")
    f.mapping("chat_template_kwargs")
    f.check()
    # The after-validator: prefill legs (do_remote_decode) are sent with max_tokens=1 and never decode.
    if not (params and params.get("do_remote_decode")) and thinking is not None and thinking.get("type") == "enabled":
        assert max_tokens is not None
        if thinking["budget_tokens"] >= max_tokens:
            raise _value_error_on_body(body, "thinking.budget_tokens must be less than max_tokens")
    assert model is not None and max_tokens is not None and messages is not None
    return MessagesRequest(body, model, messages, max_tokens, system, tools, tool_choice, stream, params)


def _value_error_on_body(body: dict[str, Any], message: str) -> RequestError:
    return validation_failed(
        [FieldError("value_error", ("body",), f"Value error, {message}", body, {"error": ValueError(message)})]
    )


def _thinking(f: Fields) -> dict[str, Any] | None:
    thinking = f.mapping("thinking")
    if thinking is None:
        return None
    kind = thinking.get("type")
    if kind not in ("enabled", "disabled", "adaptive"):
        f.fail(
            ("thinking",), "union_tag_invalid", "Input tag does not match 'enabled', 'disabled' or 'adaptive'", thinking
        )
        return None
    if kind == "enabled":
        budget = thinking.get("budget_tokens")
        if not isinstance(budget, int) or isinstance(budget, bool):
            f.fail(
                ("thinking", "enabled", "budget_tokens"),
                "missing" if budget is None else "int_type",
                "Field required" if budget is None else "Input should be a valid integer",
                thinking,
            )
            return None
        if budget < 1024:
            f.fail(
                ("thinking", "enabled", "budget_tokens"),
                "greater_than_equal",
                "Input should be greater than or equal to 1024",
                budget,
                {"ge": 1024},
            )
            return None
    return dict(thinking)


def _message(f: Fields, loc: tuple[Any, ...], message: Any) -> None:
    if not isinstance(message, dict):
        f.fail(loc, "model_type", "Input should be a valid dictionary or instance of AnthropicMessage", message)
        return
    role = message.get("role")
    if role not in _ROLES:
        f.fail(
            (*loc, "role"),
            "missing" if "role" not in message else "literal_error",
            "Field required" if "role" not in message else "Input should be 'user', 'assistant' or 'system'",
            role if "role" in message else message,
        )
    content = message.get("content")
    if "content" not in message:
        f.fail((*loc, "content"), "missing", "Field required", message)
    elif isinstance(content, list):
        since = len(f.errors)
        _blocks(f, (*loc, "content"), content)
        f.string_branch_failed(since, (*loc, "content"), content)
        changes = [b.get("type") for b in content if isinstance(b, dict) and b.get("type") in _TOOL_CHANGES]
        if changes and role != "system" and len(f.errors) == since:  # the message's after-validator
            f.fail(
                loc,
                "value_error",
                f'Value error, {changes[0]} blocks are only allowed in messages with role "system"',
                message,
            )
    elif not isinstance(content, str):
        f.fail((*loc, "content"), "string_type", "Input should be a valid string", content)


def _blocks(f: Fields, loc: tuple[Any, ...], blocks: list[Any]) -> None:
    for n, block in enumerate(blocks):
        where = (*loc, n)
        if not isinstance(block, dict):
            f.fail(
                where, "model_type", "Input should be a valid dictionary or instance of AnthropicContentBlock", block
            )
            continue
        kind = block.get("type")
        if kind not in _BLOCK_TYPES:
            f.fail((*where, "type"), "literal_error", "Input should be a content block type", kind)
            continue
        for name in _BLOCK_STR_FIELDS:
            if block.get(name) is not None and not isinstance(block[name], str):
                f.fail((*where, name), "string_type", "Input should be a valid string", block[name])
        for name in _BLOCK_DICT_FIELDS:
            if block.get(name) is not None and not isinstance(block[name], dict):
                f.fail((*where, name), "dict_type", "Input should be a valid dictionary", block[name])
        inner = block.get("content")
        if (
            inner is not None
            and not isinstance(inner, str)
            and not (isinstance(inner, list) and all(isinstance(i, dict) for i in inner))
        ):
            f.fail((*where, "content"), "string_type", "Input should be a valid string", inner)
        if kind in _TOOL_CHANGES:
            tool = block.get("tool")
            if not isinstance(tool, dict) or tool.get("type") not in ("tool_reference", "tool_definition"):
                f.fail(where, "value_error", f"Value error, tool is required for {kind} blocks", block)
            elif kind == "tool_removal" and tool["type"] != "tool_reference":
                f.fail(where, "value_error", "Value error, tool_removal only accepts a tool_reference", block)


def _tool(f: Fields, loc: tuple[Any, ...], tool: Any) -> None:
    if not isinstance(tool, dict):
        f.fail(loc, "model_type", "Input should be a valid dictionary or instance of AnthropicTool", tool)
        return
    if not isinstance(tool.get("name"), str):
        f.fail(
            (*loc, "name"),
            "missing" if "name" not in tool else "string_type",
            "Field required" if "name" not in tool else "Input should be a valid string",
            tool,
        )
    if "input_schema" not in tool:
        f.fail((*loc, "input_schema"), "missing", "Field required", tool)
    elif not isinstance(tool["input_schema"], dict):
        f.fail((*loc, "input_schema"), "dict_type", "Input should be a valid dictionary", tool["input_schema"])
    if tool.get("description") is not None and not isinstance(tool["description"], str):
        f.fail((*loc, "description"), "string_type", "Input should be a valid string", tool["description"])


# -- 2. conversion to a chat request --------------------------------------------------------------------------------
def chat_messages(system: Any, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """to_chat_completion_request's messages: the top-level system text first, then each message converted."""
    out: list[dict[str, Any]] = []
    parts = [system] if isinstance(system, str) and system else []
    if isinstance(system, list):
        parts = [
            b["text"]
            for b in system
            if b.get("type") == "text" and b.get("text") and not b["text"].startswith(BILLING_HEADER)
        ]
    if parts:
        out.append({"role": "system", "content": "".join(parts)})
    for message in messages:
        if message["role"] == "system":  # inline system messages stay in place (no merge with this template)
            text = _system_text(message["content"])
            if text:
                out.append({"role": "system", "content": text})
            continue
        converted: dict[str, Any] = {"role": message["role"]}
        if isinstance(message["content"], str):
            converted["content"] = message["content"]
        else:
            _convert_content(message["content"], message["role"], converted, out)
        if not (message["role"] == "user" and "content" not in converted):
            out.append(converted)
    return out


def _system_text(content: Any) -> str | None:
    if isinstance(content, str):
        return None if content.startswith(BILLING_HEADER) else content
    texts = [
        b["text"]
        for b in content
        if b.get("type") == "text" and b.get("text") and not b["text"].startswith(BILLING_HEADER)
    ]
    return "".join(texts) if texts else None


def _convert_content(
    blocks: list[dict[str, Any]], role: str, message: dict[str, Any], out: list[dict[str, Any]]
) -> None:
    """_convert_message_content: text and images become content parts, thinking becomes `reasoning` (joined),
    tool_use blocks `tool_calls`; a user's tool_result becomes a tool message placed before this one."""
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    reasoning: list[str] = []
    for block in blocks:
        kind = block["type"]
        if kind == "text" and block.get("text"):
            parts.append({"type": "text", "text": block["text"]})
        elif kind == "image" and block.get("source"):
            parts.append({"type": "image_url", "image_url": {"url": _image_url(block["source"])}})
        elif kind == "thinking" and block.get("thinking") is not None:
            reasoning.append(block["thinking"])
        elif kind == "tool_use":
            calls.append(
                {
                    "id": block.get("id") or f"call_{int(time.time())}",
                    "type": "function",
                    "function": {"name": block.get("name") or "", "arguments": json.dumps(block.get("input") or {})},
                }
            )
        elif kind == "tool_result":
            if role == "user":
                out.extend(_tool_result_messages(block))
            else:
                parts.append({"type": "text", "text": f"Tool result: {_py_str(block.get('content'))}"})
        # redacted_thinking (opaque), tool_reference (expanded inside tool results): nothing reaches the prompt
    if reasoning:
        message["reasoning"] = "".join(reasoning)
    if calls:
        message["tool_calls"] = calls
    if parts:
        message["content"] = parts[0]["text"] if len(parts) == 1 and parts[0]["type"] == "text" else parts


def _py_str(content: Any) -> str:
    """str(block.content) of the pydantic model: Python's repr for a list of dicts, "" for nothing."""
    return str(content) if content else ""


def _image_url(source: dict[str, Any]) -> str:
    if source.get("type") == "url":
        return str(source.get("url", ""))
    return f"data:{source.get('media_type', 'image/jpeg')};base64,{source.get('data', '')}"


def _tool_result_messages(block: dict[str, Any]) -> list[dict[str, Any]]:
    """_convert_user_tool_result: the tool message, then any images as a user message, then tool references."""
    text, images, references = "", [], []
    content = block.get("content")
    if isinstance(content, str):
        text = content
    elif isinstance(content, list):
        texts = []
        for item in content:
            if item.get("type") == "text":
                texts.append(item.get("text", ""))
            elif item.get("type") == "image":
                url = _image_url(item.get("source", {}))
                if url:
                    images.append(url)
            elif item.get("type") == "tool_reference" and (item.get("tool_name") or item.get("name")):
                references.append({"type": "tool_reference", "name": item.get("tool_name") or item.get("name")})
        text = "\n".join(texts)
    out: list[dict[str, Any]] = [
        {"role": "tool", "tool_call_id": block.get("tool_use_id") or "", "content": text or ""}
    ]
    if images:
        out.append({"role": "user", "content": [{"type": "image_url", "image_url": {"url": u}} for u in images]})
    if references:
        out.append({"role": "tool", "tool_call_id": block.get("tool_use_id") or "", "content": references})
    return out


def resolved_tools(req: MessagesRequest) -> list[dict[str, Any]] | None:
    """_resolve_tools: tool_addition/tool_removal blocks in the messages change the declared tools."""
    changes = [
        b
        for m in req.messages
        if isinstance(m["content"], list)
        for b in m["content"]
        if b.get("type") in ("tool_addition", "tool_removal")
    ]
    if not changes:
        return req.tools
    tools = {t["name"]: t for t in req.tools or []}
    removed: set[Any] = set()
    for block in changes:
        change = block["tool"]
        if change["type"] == "tool_definition":
            definition = change.get("definition") or {}
            name = definition.get("name")
            tools[name] = definition
        else:
            name = change.get("name")
            if name not in tools:
                raise ValueError(f"{block['type']} references tool {name!r}, which is not declared in tools")
            if block["type"] == "tool_addition":
                tools[name] = {**tools[name], "defer_loading": None}
        if block["type"] == "tool_removal":
            removed.add(name)
        else:
            removed.discard(name)
    return [t for n, t in tools.items() if n not in removed]


def tool_dicts(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """_convert_tools, then the chat path's `tool.model_dump()`: a function with the input schema as parameters
    (AnthropicTool adds "type": "object" when the schema has no type; FunctionDefinition drops a null strict or
    defer_loading)."""
    if tools is None:
        return None
    out = []
    for tool in tools:
        schema = dict(tool["input_schema"])
        schema.setdefault("type", "object")
        function: dict[str, Any] = {"name": tool["name"], "description": tool.get("description"), "parameters": schema}
        for key in ("strict", "defer_loading"):
            if tool.get(key) is not None:
                function[key] = tool[key]
        out.append({"type": "function", "function": function})
    return out


@dataclass
class ChatRequest:
    """What to_chat_completion_request keeps for the prompt: the messages and the tools."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None


def to_chat_request(req: MessagesRequest) -> ChatRequest:
    try:
        return ChatRequest(chat_messages(req.system, req.messages), tool_dicts(resolved_tools(req)))
    except ValueError as e:  # the route answers what the conversion raises with a 400
        raise RequestError(400, str(e), "BadRequestError") from e


def render_prompt(chat: ChatRequest) -> list[int]:
    """The prompt tokens of the converted chat request (a new assistant turn: no continue_final_message)."""
    try:
        return render_conversation(parse_messages(chat.messages), chat.tools or None)
    except TemplateError as e:
        raise RequestError(400, str(e), "BadRequestError") from e


# -- 4. the answer --------------------------------------------------------------------------------------------------
def stop_reason(finish_reason: str) -> str:
    """_to_anthropic_stop_reason for the simulator's replies: no stop strings, no tool calls."""
    return "max_tokens" if finish_reason == "length" else "end_turn"


def full_response(response_id: str, model: str, run: Running) -> dict[str, Any]:
    """messages_full_converter, dumped with exclude_none (a null stop_sequence or kv_transfer_params is left out)."""
    text = gen.chat_text(run.output)
    body: dict[str, Any] = {
        "id": response_id,
        "type": "message",
        "role": "assistant",
        "content": [{"type": "text", "text": text}],  # an empty reply is one empty text block
        "model": model,
        "stop_reason": stop_reason(run.finish_reason),
        "usage": {"input_tokens": len(run.req.prompt), "output_tokens": len(run.output)},
    }
    if run.kv_params_out is not None:
        body[KV_PARAMS_FIELD] = run.kv_params_out
    return body


# The stream's events, as message_stream_converter dumps them (exclude_unset: only the fields it set).
def message_start(response_id: str, model: str, prompt_tokens: int) -> bytes:
    message: dict[str, Any] = {
        "id": response_id,
        "type": "message",
        "role": "assistant",
        "content": [],
        "model": model,
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": prompt_tokens, "output_tokens": 0},
    }
    return sse("message_start", {"type": "message_start", "message": message})


def block_start() -> bytes:
    return sse(
        "content_block_start",
        {"type": "content_block_start", "content_block": {"type": "text", "text": ""}, "index": 0},
    )


def block_delta(text: str) -> bytes:
    return sse(
        "content_block_delta",
        {"type": "content_block_delta", "delta": {"type": "text_delta", "text": text}, "index": 0},
    )


def block_stop() -> bytes:
    return sse("content_block_stop", {"type": "content_block_stop", "index": 0})


def message_end(finish_reason: str, usage: dict[str, int]) -> bytes:
    """message_delta (the stop reason and the final usage), then message_stop."""
    delta = {"stop_reason": stop_reason(finish_reason), "stop_sequence": None}
    return sse("message_delta", {"type": "message_delta", "delta": delta, "usage": usage}) + sse(
        "message_stop", {"type": "message_stop"}
    )


def stream_error(status: int, message: str) -> bytes:
    return sse("error", {"type": "error", "error": {"type": error_type(status), "message": message}})


# -- the route ------------------------------------------------------------------------------------------------------
class MessagesRoute:
    def __init__(self, engine: Engine):
        self.engine = engine
        self.model = engine.cfg.model
        self.max_model_len = engine.cfg.max_model_len

    def add_to(self, app: web.Application) -> None:
        app.router.add_post("/v1/messages", self.create)

    async def create(self, request: web.Request) -> web.StreamResponse:
        try:  # 1.
            req = parse_request(await read_json_object(request))
        except RequestError as e:
            return openai_error(e)
        try:
            chat = to_chat_request(req)  # 2.
            # 3. (the chat path's order: model, output cap, rendering, prompt length, sampling cap)
            if req.model != self.model:
                raise RequestError(
                    404,
                    f"The model `{req.model}` does not exist. Valid aliases: {self.model}.",
                    "NotFoundError",
                    "model",
                )
            if req.max_tokens > self.max_model_len:
                raise invalid(
                    f"max_completion_tokens={req.max_tokens} cannot be greater than max_model_len="
                    f"{self.max_model_len}. Please request fewer output tokens.",
                    "max_completion_tokens",
                    req.max_tokens,
                )
            prompt = render_prompt(chat)
            check_prompt_fits(len(prompt), self.max_model_len)
            max_tokens = sampled_max_tokens(self.max_model_len, req.max_tokens, len(prompt))
            check_max_tokens(max_tokens)
            given = request.headers.get("X-Request-Id")
            response_id = f"chatcmpl-{random_uuid() if given is None else given}"
            return await self._generate(request, req, response_id, prompt, max_tokens)
        except RequestError as e:
            return anthropic_error(e)

    async def _generate(
        self, request: web.Request, req: MessagesRequest, response_id: str, prompt: list[int], max_tokens: int
    ) -> web.StreamResponse:
        greq = GenerationRequest(
            request_id=f"{response_id}-{random_uuid()[:8]}",
            prompt=prompt,
            max_tokens=max_tokens,
            kv_params=kv_params(req.kv_transfer_params),
            trace_headers=trace_headers(request.headers),
        )
        try:
            async with generation(self.engine, greq) as run:
                if req.stream:
                    return await self._stream(request, run, response_id)
                await decode_all(self.engine, run)
        except GenerationFailed:
            if req.stream:  # the chat stream's role chunk went out before the error chunk
                resp = await open_stream(request)
                await resp.write(message_start(response_id, self.model, len(prompt)))
                await resp.write(stream_error(500, GenerationFailed.message))
                await resp.write_eof()
                return resp
            return anthropic_error(RequestError(500, GenerationFailed.message, "InternalServerError"))
        except OutOfBlocks as e:
            return anthropic_error(RequestError(503, str(e), "ServiceUnavailableError"))
        return json_response(full_response(response_id, self.model, run))

    async def _stream(self, request: web.Request, run: Running, response_id: str) -> web.StreamResponse:
        """message_stream_converter over the chat stream (include_usage, continuous_usage_stats): message_start from
        the role chunk, one text block opened by the first non-empty delta, the end from the usage chunk."""
        resp = await open_stream(request)
        await resp.write(message_start(response_id, self.model, len(run.req.prompt)))
        text = ""
        try:
            async with aclosing(self.engine.decode(run)) as tokens:
                async for i, tok in _enumerate(tokens):
                    delta = gen.chat_delta(i, tok)
                    if delta:  # the EOS token's empty text emits nothing
                        await resp.write((b"" if text else block_start()) + block_delta(delta))
                        text += delta
        except OutOfBlocks as e:  # a mid-stream failure: the open block is closed, then an error event
            await resp.write((block_stop() if text else b"") + stream_error(503, str(e)))
            await resp.write_eof()
            return resp
        usage = {"input_tokens": len(run.req.prompt), "output_tokens": len(run.output)}
        await resp.write((block_stop() if text else b"") + message_end(run.finish_reason, usage))
        await resp.write_eof()
        return resp


async def _enumerate(it: Any) -> Any:
    i = 0
    async for x in it:
        yield i, x
        i += 1

"""OpenAI's Responses API (`POST /v1/responses`), as vLLM 0.33 serves it.

History: vLLM turns `instructions` and the `input` items into chat messages before the template renders them
(`entrypoints/openai/responses/utils.py`): a function call or reasoning item folds into the assistant message just
before it, and only the first text part of an assistant output message reaches the prompt. The digest is taken of
those messages, so that a follow-up that resends the previous input, then the previous response's `output`, then new
items matches exactly what decode's blocks cover. What this module cannot be sure reaches the prompt the same way
(files, remote images, custom tools, an unfinished item that vLLM would continue) makes the history uncomparable:
a miss, never a wrong replay.

`previous_response_id` is refused with a 400 saying how to send the whole input instead: the prefill and the decode
engine are different processes, and neither holds the other's stored responses.
"""

from __future__ import annotations

import json
from typing import Any, cast

from duplex_sidecars.protocol import PREFILL_DROPPED_FIELDS, LegShape
from duplex_sidecars.router.apis.api import Api, is_int
from duplex_sidecars.router.errors import error_json
from duplex_sidecars.router.history import Covered, History, Reply, normalize_message
from duplex_sidecars.router.relay import StreamShape

ROUTE = "responses"
PREVIOUS_RESPONSE_ID = (
    "'previous_response_id' is not supported through a prefill-decode deployment: no engine holds the other's stored "
    "responses. Send the whole conversation as 'input': the previous input items, then the previous response's "
    "'output' items, then the new ones (and 'store': false)."
)
SCOPE_FIELDS: tuple[str, ...] = (
    "model",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "text",
    "reasoning",
    "chat_template",
    "chat_template_kwargs",
    "cache_salt",
    "truncation",
    "mm_processor_kwargs",
)
_UNFINISHED = ("in_progress", "incomplete")
_TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed"})


class _Uncomparable(Exception):
    """The items hold something whose effect on the prompt this module does not mirror."""


def _text_of_assistant(content: Any) -> str:
    if isinstance(content, str):
        return content
    if (
        isinstance(content, list)
        and content
        and isinstance(content[0], dict)
        and isinstance(content[0].get("text"), str)
    ):
        return str(content[0]["text"])
    raise _Uncomparable


def _user_content(content: Any) -> Any:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _Uncomparable
    parts = []
    for part in content:
        if not isinstance(part, dict):
            raise _Uncomparable
        kind = part.get("type")
        if kind == "input_text" and isinstance(part.get("text"), str):
            parts.append({"type": "input_text", "text": part["text"]})
        elif kind == "input_image" and str(part.get("image_url") or "").startswith("data:"):
            parts.append({"type": "input_image", "image_url": part["image_url"], "detail": part.get("detail")})
        else:
            raise _Uncomparable  # files and remote images may not give the same bytes again
    return parts


def _call(item: dict[str, Any]) -> dict[str, Any]:
    name, namespace = item.get("name"), item.get("namespace")
    if not isinstance(name, str) or not isinstance(item.get("call_id"), str):
        raise _Uncomparable
    return {
        "id": item["call_id"],
        "type": "function",
        "function": {"name": f"{namespace}__{name}" if namespace else name, "arguments": item.get("arguments")},
    }


def _fold(messages: list[dict[str, Any]], item: Any) -> None:
    """Add one input or output item to the chat messages, as vLLM's conversion does."""
    if not isinstance(item, dict):
        raise _Uncomparable
    kind = item.get("type") or ("message" if "role" in item else None)
    prev = messages[-1] if messages and messages[-1].get("role") == "assistant" else None
    if kind == "function_call":
        if prev is not None:
            prev.setdefault("tool_calls", []).append(_call(item))
        else:
            messages.append({"role": "assistant", "tool_calls": [_call(item)]})
    elif kind == "function_call_output":
        output = item.get("output")
        messages.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": output})
    elif kind == "reasoning":
        if item.get("encrypted_content"):
            raise _Uncomparable
        parts = item.get("content") or item.get("summary") or []
        text = parts[0].get("text", "") if parts and isinstance(parts[0], dict) else ""
        if prev is not None and prev.get("reasoning") is None:
            prev["reasoning"] = text
        else:
            messages.append({"role": "assistant", "reasoning": text})
    elif kind == "message" and item.get("role") == "assistant":
        text = _text_of_assistant(item.get("content"))
        if prev is not None and prev.get("content") is None:
            prev["content"] = text
        else:
            messages.append({"role": "assistant", "content": text})
    elif kind == "message" and item.get("role") in ("user", "system", "developer"):
        message = {"role": item["role"], "content": _user_content(item.get("content"))}
        if item.get("name") is not None:
            message["name"] = item["name"]
        messages.append(message)
    else:
        raise _Uncomparable  # custom tools, item references, built-in tool calls, ...


def chat_messages(body: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The chat messages vLLM renders for a Responses request, in comparable form; None when uncomparable."""
    messages: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if instructions:
        if not isinstance(instructions, str):
            return None
        messages.append({"role": "system", "content": instructions})
    items = body.get("input")
    try:
        if isinstance(items, str):
            messages.append({"role": "user", "content": items})
        elif isinstance(items, list):
            if items and isinstance(items[-1], dict) and items[-1].get("status") in _UNFINISHED:
                return None  # vLLM continues an unfinished last item instead of starting a turn
            for item in items:
                _fold(messages, item)
        else:
            return None
    except _Uncomparable:
        return None
    normalized = [normalize_message(m) for m in messages]
    return None if any(m is None for m in normalized) else cast(list[dict[str, Any]], normalized)


def history(body: dict[str, Any]) -> History | None:
    messages = chat_messages(body)
    return History.of_messages(messages) if messages else None


def reply_of_body(response: dict[str, Any]) -> Reply:
    """The reply of a response object: its output items as the one assistant message a follow-up resends."""
    output = response.get("output")
    if not isinstance(output, list):
        return Reply(choices=0)
    messages: list[dict[str, Any]] = []
    try:
        for item in output:
            _fold(messages, item)
    except _Uncomparable:
        return Reply(choices=0)
    if len(messages) != 1 or messages[0].get("role") != "assistant":
        return Reply(choices=0)  # several turns in one answer: which one decode's blocks end with is unclear
    message = normalize_message(messages[0]) or {}
    calls = message.get("tool_calls") or ()
    status = response.get("status")
    reason = (response.get("incomplete_details") or {}).get("reason")
    if status == "completed":
        finish = "tool_calls" if calls else "stop"
    elif status == "incomplete" and reason == "max_output_tokens":
        finish = "length"
    else:
        finish = None
    return Reply(
        content=message.get("content"),
        tool_calls=tuple(calls),
        reasoning=message.get("reasoning"),
        finish_reason=finish,
        message=message,
    )


class Collector:
    """A Responses stream's reply: the terminal event carries the whole response object."""

    def __init__(self) -> None:
        self._reply = Reply(choices=0)

    def add(self, event: dict[str, Any], exact: bool = True) -> None:
        if event.get("type") in _TERMINAL and isinstance(event.get("response"), dict):
            self._reply = reply_of_body(event["response"]) if exact else Reply(choices=0)

    def reply(self) -> Reply:
        return self._reply


def covered(history: History, reply: Reply) -> Covered:
    return history.covered_with_message(reply.message or {})


def stream_error(message: str) -> bytes:
    event = {"type": "error", "code": "server_error", "message": message, "param": None}
    return b"event: error\ndata: " + json.dumps(event).encode() + b"\n\n"


API = Api(
    route=ROUTE,
    path="/v1/responses",
    checks=(
        ("stream", False, lambda v: isinstance(v, bool), "'stream' must be a boolean.", "invalid_type"),
        (
            "input",
            True,
            lambda v: isinstance(v, (str, list)),
            "'input' is required: a string or a list of items.",
            "invalid_input",
        ),
        ("max_output_tokens", False, is_int, "'max_output_tokens' must be an integer.", "invalid_type"),
        ("previous_response_id", False, lambda v: False, PREVIOUS_RESPONSE_ID, "unsupported_parameter"),
    ),
    legs=LegShape(max_tokens=("max_output_tokens",), dropped=(*PREFILL_DROPPED_FIELDS, "background")),
    history=history,
    scope_fields=SCOPE_FIELDS,
    not_storable=lambda body: "truncation may cut the history" if body.get("truncation") == "auto" else None,
    reply_of_body=reply_of_body,
    collector=Collector,
    stream=StreamShape(done_marker=False, terminal_events=_TERMINAL, plain_chunks=False, error=stream_error),
    error_body=lambda status, message, type_, code: error_json(status, message, type_, code),
    covered=covered,
)

"""Anthropic's Messages API (`POST /v1/messages`), as vLLM 0.33 serves it, with errors in Anthropic's own shape.

History: `system` and every message's content blocks in a comparable form: a string is one text block, empty text
blocks and block decorations that never reach the prompt (`cache_control`, a thinking block's `signature`,
`redacted_thinking`) are left out, everything else is kept as sent. A follow-up resends the previous messages, the
assistant message with the content blocks it got back, then new messages, which is what decode's blocks cover.
A block this module does not mirror (documents, remote images, a tool call without an id, whose prompt vLLM gives
a new id every second) makes the history uncomparable: a miss, never a wrong replay.

vLLM 0.33 streams no `kv_transfer_params` on this route (its Anthropic stream converter never reads them), so a
streamed turn leaves nothing to replay: the next turn's miss is `stream_no_params`. Non-streamed turns give reuse.
"""

from __future__ import annotations

import json
from typing import Any

from duplex_sidecars.protocol import LegShape
from duplex_sidecars.router.apis.api import Api, is_int
from duplex_sidecars.router.history import Covered, History, Reply
from duplex_sidecars.router.relay import StreamShape

ROUTE = "messages"
SCOPE_FIELDS: tuple[str, ...] = (
    "model",
    "tools",
    "tool_choice",
    "thinking",
    "chat_template",
    "chat_template_kwargs",
    "cache_salt",
    "mm_processor_kwargs",
)
# Anthropic's error types by status (https://docs.anthropic.com/en/api/errors).
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}
# A stop sequence's tokens are in decode's blocks but not in the text: kept apart, so that it is never stored.
_FINISH = {"end_turn": "stop", "max_tokens": "length", "tool_use": "tool_calls", "stop_sequence": "stop_sequence"}


class _Uncomparable(Exception):
    pass


def _text_blocks(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    if not isinstance(content, list):
        raise _Uncomparable
    return [block for block in (_block(b) for b in content) if block is not None]


def _block(block: Any) -> dict[str, Any] | None:
    """A content block in comparable form; None for what never reaches the prompt."""
    if not isinstance(block, dict):
        raise _Uncomparable
    kind = block.get("type")
    if kind == "text":
        text = block.get("text")
        if not isinstance(text, str):
            raise _Uncomparable
        return {"type": "text", "text": text} if text else None
    if kind == "thinking":
        return {"type": "thinking", "thinking": block.get("thinking")}
    if kind == "redacted_thinking":
        return None
    if kind == "tool_use":
        if not isinstance(block.get("id"), str) or not block["id"]:
            raise _Uncomparable
        return {"type": "tool_use", "id": block["id"], "name": block.get("name"), "input": block.get("input")}
    if kind == "tool_result":
        result = {"type": "tool_result", "tool_use_id": block.get("tool_use_id"), "content": block.get("content")}
        if isinstance(result["content"], list):
            result["content"] = _text_blocks(result["content"])
        if block.get("is_error"):
            result["is_error"] = True
        return result
    if kind == "image" and (block.get("source") or {}).get("type") == "base64":
        source = block["source"]
        return {"type": "image", "source": {k: source.get(k) for k in ("type", "media_type", "data")}}
    raise _Uncomparable


def _message(message: Any) -> dict[str, Any]:
    if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
        raise _Uncomparable
    return {"role": message["role"], "content": _text_blocks(message.get("content"))}


def messages_of(body: dict[str, Any]) -> list[dict[str, Any]] | None:
    """A Messages request's system and messages in comparable form; None when uncomparable."""
    out: list[dict[str, Any]] = []
    try:
        system = body.get("system")
        if system:
            out.append({"role": "system", "content": _text_blocks(system)})
        messages = body.get("messages")
        if not isinstance(messages, list):
            return None
        out += [_message(m) for m in messages]
    except _Uncomparable:
        return None
    return out


def history(body: dict[str, Any]) -> History | None:
    messages = messages_of(body)
    return History.of_messages(messages) if messages else None


def reply_of_body(body: dict[str, Any]) -> Reply:
    """The reply of a message object: the assistant message with the content blocks a follow-up resends."""
    try:
        message = _message({"role": "assistant", "content": body.get("content")})
    except _Uncomparable:
        return Reply(choices=0)
    blocks = message["content"]
    text = "".join(b["text"] for b in blocks if b["type"] == "text")
    thinking = "".join(str(b.get("thinking") or "") for b in blocks if b["type"] == "thinking")
    stop_reason = body.get("stop_reason")
    return Reply(
        content=text or None,
        tool_calls=tuple(b for b in blocks if b["type"] == "tool_use"),
        reasoning=thinking or None,
        finish_reason=_FINISH.get(stop_reason) if isinstance(stop_reason, str) else None,
        message=message,
    )


class Collector:
    """A Messages stream's reply, built from its content-block events as the client's SDK builds it."""

    def __init__(self) -> None:
        self._blocks: dict[int, dict[str, Any]] = {}
        self._partial_json: dict[int, str] = {}
        self._stop: dict[str, Any] = {}
        self._broken = False

    def add(self, event: dict[str, Any], exact: bool = True) -> None:
        if not exact:
            self._broken = True
        kind, index = event.get("type"), event.get("index")
        if kind == "content_block_start" and isinstance(index, int) and isinstance(event.get("content_block"), dict):
            self._blocks[index] = dict(event["content_block"])
        elif kind == "content_block_delta" and isinstance(index, int) and index in self._blocks:
            delta = event.get("delta") or {}
            block = self._blocks[index]
            if delta.get("type") == "text_delta":
                block["text"] = block.get("text", "") + str(delta.get("text", ""))
            elif delta.get("type") == "thinking_delta":
                block["thinking"] = block.get("thinking", "") + str(delta.get("thinking", ""))
            elif delta.get("type") == "input_json_delta":
                self._partial_json[index] = self._partial_json.get(index, "") + str(delta.get("partial_json", ""))
        elif kind == "message_delta" and isinstance(event.get("delta"), dict):
            self._stop = event["delta"]

    def reply(self) -> Reply:
        if self._broken:
            return Reply(choices=0)
        blocks = []
        for index in sorted(self._blocks):
            block = self._blocks[index]
            if block.get("type") == "tool_use":
                try:
                    block["input"] = json.loads(self._partial_json.get(index) or "{}")
                except ValueError:
                    return Reply(choices=0)
            blocks.append(block)
        return reply_of_body({"content": blocks, **self._stop})


def covered(history: History, reply: Reply) -> Covered:
    return history.covered_with_message(reply.message or {})


def error_body(status: int, message: str, type_: str, code: Any) -> bytes:
    kind = _ERROR_TYPES.get(status, "api_error")
    return json.dumps({"type": "error", "error": {"type": kind, "message": message}}).encode()


def stream_error(message: str) -> bytes:
    event = {"type": "error", "error": {"type": "api_error", "message": message}}
    return b"event: error\ndata: " + json.dumps(event).encode() + b"\n\n"


API = Api(
    route=ROUTE,
    path="/v1/messages",
    checks=(
        ("stream", False, lambda v: isinstance(v, bool), "'stream' must be a boolean.", "invalid_type"),
        (
            "messages",
            True,
            lambda v: isinstance(v, list) and bool(v) and all(isinstance(m, dict) for m in v),
            "'messages' is required and must be a non-empty array of message objects.",
            "invalid_messages",
        ),
        (
            "max_tokens",
            True,
            lambda v: is_int(v) and v > 0,
            "'max_tokens' is required and must be a positive integer.",
            "invalid_max_tokens",
        ),
    ),
    legs=LegShape(max_tokens=("max_tokens",)),
    history=history,
    scope_fields=SCOPE_FIELDS,
    not_storable=lambda body: None,
    reply_of_body=reply_of_body,
    collector=Collector,
    stream=StreamShape(
        done_marker=False, terminal_events=frozenset({"message_stop"}), plain_chunks=False, error=stream_error
    ),
    error_body=error_body,
    covered=covered,
    tenant_headers=("x-api-key",),
)

"""vLLM's parse of chat messages before the chat template (renderers/chat_utils/chat_message.py in 0.33): what of each
message reaches the template, so that a prompt rendered from it depends on exactly that.

`parse_chat_message_content` keeps the role, the content as text (text-like parts joined with newlines; media parts
stay parts), and per role: an assistant's `tool_calls` and `reasoning`, a tool message's `tool_call_id`, a developer
message's `tools`, a string `name`. `_postprocess_messages` then turns tool-call arguments into objects (invalid JSON becomes `{}`) and drops
an empty `tool_calls`. Everything else on a message (ids, statuses, annotations, phases...) never reaches the prompt.
"""

from __future__ import annotations

import json
from typing import Any

from duplex_sidecars.sim.chat_template import TemplateError

# Part types parsed as text, and the key each one's text is read from (MM_PARSER_MAP).
TEXT_PART_KEYS: dict[str, str] = {
    "text": "text",
    "input_text": "text",
    "output_text": "text",
    "refusal": "refusal",
    "thinking": "thinking",
}
# A part of these types without its text is skipped (PART_TYPES_TO_SKIP_NONE_CONTENT).
_SKIP_WHEN_EMPTY = frozenset({"text", "refusal"})
# Media parts vLLM accepts; the simulator's template renders them as their JSON.
MEDIA_PART_TYPES = frozenset(
    {
        "input_image",
        "image_url",
        "image_pil",
        "image_embeds",
        "audio_url",
        "input_audio",
        "audio_embeds",
        "video_url",
        "video_embeds",
        "prompt_embeds",
        "tool_reference",
    }
)
# Claude Code's attribution line changes on every request; vLLM drops it from system text (and so from the prompt).
BILLING_HEADER = "x-anthropic-billing-header"


def _strip_billing_header(parts: list[Any]) -> list[Any]:
    out: list[Any] = []
    for part in parts:
        text = part if isinstance(part, str) else None
        if isinstance(part, dict) and part.get("type") == "text":
            text = part.get("text")
        if not (isinstance(text, str) and text.startswith(BILLING_HEADER)):
            out.append(part)
            continue
        rest = text.partition("\n")[2]
        if rest:
            out.append(rest if isinstance(part, str) else {**part, "text": rest})
    return out


def _part(part: Any) -> str | dict[str, Any] | None:
    """One content part: its text, the part itself for media, None when vLLM skips it."""
    if isinstance(part, str):
        return part
    if not isinstance(part, dict):
        raise TemplateError("content parts must be strings or objects")
    kind = part.get("type")
    if kind is None:
        if any(k in part for k in MEDIA_PART_TYPES):
            return part
        raise TemplateError("Missing 'type' field in multimodal part.")
    if not isinstance(kind, str):
        raise TemplateError("Invalid 'type' field in multimodal part.")
    if kind in MEDIA_PART_TYPES:
        return part
    key = TEXT_PART_KEYS.get(kind)
    if key is None:
        raise TemplateError(f"Unsupported chat content part type: {kind!r}.")
    text = part.get(key)
    if text is None and kind in _SKIP_WHEN_EMPTY:
        return None
    if not isinstance(text, str):
        raise TemplateError(f"the '{key}' of a '{kind}' part must be a string")
    return text


def _content(role: str, content: Any) -> str | list[Any]:
    """The message content as vLLM's "string" content format gives it to the template: text parts joined by
    newlines; with media parts, a list of text and media parts in order (the simulator's template renders media
    parts as their JSON)."""
    if content is None:
        parts: list[Any] = []
    elif isinstance(content, str):
        parts = [{"type": "text", "text": content}]
    elif isinstance(content, list):
        parts = content
    else:
        raise TemplateError(f"unsupported message content of type {type(content).__name__}")
    if role == "system":
        parts = _strip_billing_header(parts)
    items = [item for item in map(_part, parts) if item is not None]
    if all(isinstance(i, str) for i in items):
        return "\n".join(items)  # type: ignore[arg-type]
    return [{"type": "text", "text": i} if isinstance(i, str) else i for i in items]


def _tool_calls(calls: Any) -> list[dict[str, Any]]:
    if not isinstance(calls, list):
        calls = list(calls)
    out = []
    for call in calls:
        if not isinstance(call, dict):
            raise TemplateError("assistant tool_calls entries must be objects.")
        function = call.get("function")
        if call.get("type", "function") != "function" or not isinstance(function, dict):
            raise TemplateError("chat completions only support assistant tool_calls of type 'function'.")
        out.append({**call, "function": {**function, "arguments": _arguments(function.get("arguments"))}})
    return out


def _arguments(arguments: Any) -> Any:
    """Tool-call arguments as templates get them: an object; what does not decode to one becomes `{}` (vLLM keeps
    a conversation with a malformed call going rather than failing every later turn)."""
    if not arguments:
        return {}
    if isinstance(arguments, dict):
        return arguments
    parsed = arguments
    if isinstance(arguments, str):
        try:
            parsed = json.loads(arguments)
        except json.JSONDecodeError:
            return {}
    return parsed if isinstance(parsed, dict) else {}


def parse_message(message: Any) -> dict[str, Any]:
    """The part of one chat message that reaches the template."""
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise TemplateError("each message must be an object with a string 'role'")
    role = message["role"]
    out: dict[str, Any] = {"role": role, "content": _content(role, message.get("content"))}
    if role == "assistant":
        if message.get("tool_calls") is not None:
            calls = _tool_calls(message["tool_calls"])
            if calls:
                out["tool_calls"] = calls
        reasoning = message.get("reasoning")
        if reasoning is not None:
            out["reasoning"] = reasoning
            out["reasoning_content"] = reasoning
    elif role == "tool" and "tool_call_id" in message:
        out["tool_call_id"] = message["tool_call_id"]
    if isinstance(message.get("name"), str):
        out["name"] = message["name"]
    if role == "developer":  # tools announced mid-conversation (Responses' additional_tools)
        out["tools"] = message.get("tools")
    return out


def parse_messages(messages: list[Any]) -> list[dict[str, Any]]:
    """The conversation the template sees."""
    return [parse_message(m) for m in messages]

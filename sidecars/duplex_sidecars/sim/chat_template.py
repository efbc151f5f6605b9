"""A deterministic chatml-like chat template rendered straight to token ids.

Rendering per piece (never a string that is tokenized as a whole) makes the prompt of turn N+1 start with exactly the
tokens decode computed in turn N: the previous prompt, the assistant header, then the generated reply tokens.
"""

from __future__ import annotations

import json
from typing import Any

from duplex_sidecars.sim.tokenizer import IM_END, IM_START, SPECIAL_TOKENS, token_id, tokenize

_NAME = SPECIAL_TOKENS["<|name|>"]
_TOOL_CALL = SPECIAL_TOKENS["<|tool_call|>"]
_TOOL_CALL_ID = SPECIAL_TOKENS["<|tool_call_id|>"]
_TOOLS = SPECIAL_TOKENS["<|tools|>"]
_REASONING = SPECIAL_TOKENS["<|reasoning|>"]


class TemplateError(ValueError):
    """A message the template cannot render (the HTTP layer answers 400)."""


def _content_tokens(content: Any) -> list[int]:
    if content is None:
        return []
    if isinstance(content, str):
        return tokenize(content)
    if isinstance(content, list):
        out: list[int] = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text":
                out += tokenize(str(part.get("text", "")))
            else:
                # Non-text parts (images, audio) still shape the prompt; any stable rendering will do.
                out += tokenize(json.dumps(part, sort_keys=True))
        return out
    raise TemplateError(f"unsupported message content of type {type(content).__name__}")


def _tool_call_tokens(call: Any) -> list[int]:
    if not isinstance(call, dict):
        raise TemplateError("tool_calls entries must be objects")
    fn = call.get("function") or {}
    args = fn.get("arguments", "")
    if not isinstance(args, str):
        args = json.dumps(args, sort_keys=True)
    out = [_TOOL_CALL]
    if call.get("id"):
        out += [_TOOL_CALL_ID] + tokenize(str(call["id"]))
    return out + tokenize(str(fn.get("name", ""))) + tokenize(args)


def assistant_header() -> list[int]:
    """The generation prompt: what follows the history before the model's reply."""
    return [IM_START, token_id("assistant")]


def _message_tokens(message: Any) -> list[int]:
    """Tokens of one message from its header through its content (what `continue_final_message` continues)."""
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise TemplateError("each message must be an object with a string 'role'")
    out = [IM_START, token_id(message["role"])]
    if message.get("name"):
        out += [_NAME] + tokenize(str(message["name"]))
    if message.get("tool_call_id"):
        out += [_TOOL_CALL_ID] + tokenize(str(message["tool_call_id"]))
    if message["role"] == "developer" and message.get("tools"):  # tools announced mid-conversation
        out += [_TOOLS] + tokenize(json.dumps(message["tools"], sort_keys=True))
    # Like the thinking-aware templates, an assistant turn's reasoning goes before its answer.
    if message["role"] == "assistant" and isinstance(message.get("reasoning"), str):
        out += [_REASONING] + tokenize(message["reasoning"])
    return out + _content_tokens(message.get("content"))


def render_message(message: Any) -> list[int]:
    """Tokens of one message, from its header to its end-of-turn token."""
    out = _message_tokens(message)
    for call in message.get("tool_calls") or []:
        out += _tool_call_tokens(call)
    return out + [IM_END]


def render_conversation(
    messages: list[Any], tools: Any = None, add_generation_prompt: bool = True, continue_final_message: bool = False
) -> list[int]:
    """The prompt of a conversation (possibly empty), as vLLM's renderer asks a template for it: the tools, every
    message, then the generation prompt, or with `continue_final_message` the last message left open."""
    out: list[int] = []
    if tools:
        out += [IM_START, _TOOLS] + tokenize(json.dumps(tools, sort_keys=True)) + [IM_END]
    last = len(messages) - 1
    for i, message in enumerate(messages):
        out += _message_tokens(message) if continue_final_message and i == last else render_message(message)
    if add_generation_prompt:
        out += assistant_header()
    return out


def render_chat(messages: Any, tools: Any = None, add_generation_prompt: bool = True) -> list[int]:
    """The prompt tokens of a chat request."""
    if not isinstance(messages, list) or not messages:
        raise TemplateError("'messages' must be a non-empty list")
    return render_conversation(messages, tools, add_generation_prompt)

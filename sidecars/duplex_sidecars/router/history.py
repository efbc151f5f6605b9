"""Digests that decide whether decode's retained blocks may be replayed for a new request.

The D->P pull is positional: P copies the remote blocks over the first tokens of the new prompt without comparing
them. So a stored entry carries a digest of the exact history its blocks cover (the request's messages or prompt
plus the generated reply) and of the request fields that change tokenization; a new request may reuse the blocks
only when its history starts with exactly that covered history under an equal scope. Nothing raw is kept: state
keys and digests are SHA-256.

Every digest starts with a tag carrying `DIGEST_VERSION`, bumped whenever the bytes behind a digest change: entries
written by another version (Redis is shared by a rolling upgrade) are then simply not found, never misread.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, cast

import orjson

if TYPE_CHECKING:
    from _hashlib import HASH  # what hashlib.sha256() returns

ANONYMOUS_TENANT = "anonymous"

# 2: canonical JSON written by orjson; state keys length-prefixed instead of JSON.
DIGEST_VERSION = 2
_V = b"/%d\0" % DIGEST_VERSION

CHAT_ROUTE = "chat"
COMPLETIONS_ROUTE = "completions"

# Request fields that change how the prompt is rendered or tokenized (or what the cached blocks mean). Two requests
# may share blocks only when all of these are equal. Unknown fields are left out on purpose: they do not reach the
# prompt in vLLM.
SCOPE_FIELDS: tuple[str, ...] = (
    "model",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "functions",
    "function_call",
    "chat_template",
    "chat_template_kwargs",
    "add_generation_prompt",
    "continue_final_message",
    "add_special_tokens",
    "documents",
    "cache_salt",
    "truncate_prompt_tokens",
    "reasoning_effort",
    "response_format",
    "mm_processor_kwargs",
    "echo",
    "suffix",
)

# Message keys that reach the chat template: what vLLM's parser copies into its ConversationMessage (role, content,
# name; an assistant's tool_calls and reasoning; a tool's tool_call_id; a developer's tools; task). The vLLM tier
# checks this list against vLLM's own types.
MESSAGE_KEYS: tuple[str, ...] = (
    "role",
    "content",
    "name",
    "tool_calls",
    "tool_call_id",
    "reasoning_content",
    "reasoning",
    "tools",
    "task",
)
# Keys of a reply message that SDKs echo back and vLLM never renders. Any other key makes a history uncomparable (a
# miss, never a wrong replay): a field vLLM starts to render must not be dropped from the digest unnoticed.
DECORATION_KEYS = frozenset({"refusal", "annotations", "audio", "function_call"})

# Content part types whose payload is inline text; media parts are allowed only as inline data URLs, since a
# remote URL may serve different bytes next time.
_TEXT_PART_TYPES = frozenset({"text", "input_text", "output_text"})
_MESSAGE_KEY_SET = frozenset(MESSAGE_KEYS)
_KNOWN_KEYS = _MESSAGE_KEY_SET | DECORATION_KEYS


def canonical(obj: Any) -> bytes:
    """Canonical JSON: sorted keys, no whitespace, UTF-8. For values read exactly (`jsonio.loads`): orjson would write
    a NaN as null, so a value that may hold one must not get here."""
    try:
        return orjson.dumps(obj, option=orjson.OPT_SORT_KEYS)
    except TypeError:
        # Integers beyond 64 bits, lone surrogates: the standard library writes them, still one encoding per value.
        # Raises ValueError for NaN and Infinity.
        text = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        return text.encode("utf-8", "surrogatepass")


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def key_tenant(name: str) -> str:
    """The tenant of a client key (client_auth): its name, in a domain that no header tenant can reach."""
    return _key(b"tenant-key", name)


def gateway_tenant(gateway: str, user: str) -> str:
    """The tenant of a gateway's user: the user the gateway names, within that gateway's key, in a domain of its own."""
    return _key(b"tenant-gateway", gateway, user)


def header_tenant(values: Sequence[str | None]) -> str:
    """The tenant of a request without a client key: a digest of its tenant headers, or the anonymous tenant."""
    if not any(values):
        return ANONYMOUS_TENANT
    return _key(b"tenant-headers", *(v or "" for v in values))


def _key(tag: bytes, *parts: str) -> str:
    h = hashlib.sha256(tag + _V)
    for part in parts:
        data = part.encode("utf-8", "surrogatepass")
        h.update(len(data).to_bytes(8, "big"))  # length-prefixed: no two different part lists give the same bytes
        h.update(data)
    return h.hexdigest()


def state_key(tenant: str, model: str, conversation_id: str) -> str:
    """The store key of a conversation named by the client: hashed, so neither ids nor credentials are kept in the
    store."""
    return _key(b"conv", tenant, model, conversation_id)


def history_base(tenant: str, model: str, session: str, scope: str) -> str:
    """What every history key of a conversation without an id starts from: its tenant, model, harness session (""
    without one) and scope digest."""
    return _key(b"histbase", tenant, model, session, scope)


def history_key(base: str, covered_digest: str) -> str:
    """The store key of decode's blocks covering a history (its digest), for conversations keyed by their history:
    the next turn finds them by the digest of its messages up to its last assistant turn."""
    return _key(b"hist", base, covered_digest)


def scope_digest(route: str, body: dict[str, Any], fields: tuple[str, ...] = SCOPE_FIELDS) -> str:
    """Digest of the fields that change tokenization. Raises TypeError when one cannot be written exactly."""
    scope = {"route": route}
    for field in fields:
        value = body.get(field)
        if value is not None:
            scope[field] = value
    return _sha(b"scope" + _V + canonical(scope))


def normalize_message(message: Any) -> dict[str, Any] | None:
    """The part of a message that reaches the prompt (the message itself when that is all of it); None when it is
    not a message object, or has a key that is neither rendered nor a known decoration."""
    if not isinstance(message, dict):
        return None
    if "tool_calls" not in message and message.keys() <= _MESSAGE_KEY_SET and None not in message.values():
        return message  # the common case, already normal: {"role", "content"}
    if not message.keys() <= _KNOWN_KEYS:
        return None
    out = {k: message[k] for k in MESSAGE_KEYS if message.get(k) is not None}
    if "tool_calls" in out:
        if out["tool_calls"] == []:
            del out["tool_calls"]
        elif isinstance(out["tool_calls"], list):
            out["tool_calls"] = [_normalize_tool_call(c) for c in out["tool_calls"]]
    # An assistant turn that only calls tools renders the same with content "" or null (templates test truthiness),
    # and SDKs disagree on which one they echo back.
    if out.get("tool_calls") and out.get("content") == "":
        del out["content"]
    return out


def _normalize_tool_call(call: Any) -> Any:
    # Streamed calls carry an `index`; templates see id, type and function name/arguments only.
    if not isinstance(call, dict):
        return call
    out = {k: call[k] for k in ("id", "type") if call.get(k) is not None}
    function = call.get("function")
    if isinstance(function, dict):
        out["function"] = {k: function[k] for k in ("name", "arguments") if function.get(k) is not None}
    elif function is not None:
        out["function"] = function
    return out


def _content_is_stable(content: Any) -> bool:
    if content is None or isinstance(content, str):
        return True
    if not isinstance(content, list):
        return False
    for part in content:
        if not isinstance(part, dict):
            return False
        kind = part.get("type")
        if kind in _TEXT_PART_TYPES:
            continue
        payload = part.get(kind) if isinstance(kind, str) else None
        url = payload.get("url") if isinstance(payload, dict) else payload
        if not (isinstance(url, str) and url.startswith("data:")):
            return False
    return True


@dataclass(frozen=True)
class Covered:
    """The history a stored entry's blocks cover: a digest and its length (messages, or characters of a prompt)."""

    kind: Literal["messages", "text"]
    digest: str
    length: int


@dataclass(frozen=True)
class Reply:
    """What decode generated for a request, as far as the prompt of the next turn is concerned."""

    content: str | None = None
    tool_calls: tuple[dict[str, Any], ...] = ()
    reasoning: str | None = None
    finish_reason: str | None = None
    stop_reason: Any = None
    choices: int = 1
    # The reply as the next request will resend it, in its API's comparable form (APIs other than OpenAI chat).
    message: dict[str, Any] | None = None


class History:
    """A request's prompt in comparable form: canonical messages (chat) or the prompt text (completions)."""

    def __init__(
        self,
        kind: Literal["messages", "text"],
        messages: list[bytes] | None = None,
        text: str = "",
        turn_boundary: int = 0,
    ):
        self.kind = kind
        self._messages = messages or []
        self._text = text
        # Messages up to and including the last assistant turn: what the previous turn's blocks covered, if this
        # request continues one (0: nothing to continue).
        self.turn_boundary = turn_boundary
        # The running digest over the first n messages: the reuse check and the record after decode both hash the
        # same leading messages, so the second continues where the first stopped.
        self._running: tuple[int, HASH] = (0, _messages_hasher())

    @classmethod
    def of_request(cls, route: str, body: dict[str, Any]) -> History | None:
        """The request's history, or None when it cannot be compared safely (token prompts, odd shapes)."""
        if route == CHAT_ROUTE:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                return None
            normalized = [normalize_message(m) for m in messages]
            if any(m is None or not _content_is_stable(m.get("content")) for m in normalized):
                return None
            return cls.of_messages(cast(list[dict[str, Any]], normalized))  # no None: checked above
        prompt = body.get("prompt")
        if isinstance(prompt, str) and prompt:
            return cls("text", text=prompt)
        return None

    @classmethod
    def of_messages(cls, messages: list[dict[str, Any]]) -> History | None:
        """The history of messages already in their comparable form (each API normalizes its own); the turn boundary
        follows the last assistant message. None when one cannot be written exactly."""
        encoded = []
        boundary = 0
        for i, message in enumerate(messages):
            try:
                encoded.append(canonical(message))
            except (TypeError, ValueError):
                return None
            if message.get("role") == "assistant":
                boundary = i + 1
        return cls("messages", messages=encoded, turn_boundary=boundary)

    def __len__(self) -> int:
        return len(self._messages) if self.kind == "messages" else len(self._text)

    def prefix_digest(self, length: int) -> str | None:
        """Digest of the first `length` messages or characters; None when the history is shorter."""
        if length <= 0 or length > len(self):
            return None
        if self.kind == "text":
            return _text_digest(self._text[:length])
        return self._hash_of_first(length).hexdigest()

    def matches(self, covered: Covered) -> bool:
        return covered.kind == self.kind and self.prefix_digest(covered.length) == covered.digest

    def covered_with(self, reply: Reply) -> Covered:
        """The history decode's retained blocks cover after generating `reply` for this request (an OpenAI chat or
        completions request)."""
        if self.kind == "text":
            text = self._text + (reply.content or "")
            return Covered("text", _text_digest(text), len(text))
        assistant: dict[str, Any] = {"role": "assistant", "content": reply.content}
        if reply.tool_calls:
            assistant["tool_calls"] = list(reply.tool_calls)
        return self.covered_with_message(normalize_message(assistant) or {})

    def covered_with_message(self, message: dict[str, Any]) -> Covered:
        """The history covered after this request's messages and `message` (the reply, in the comparable form the
        next request will resend it in)."""
        generated = canonical(message)
        h = self._hash_of_first(len(self._messages)).copy()
        _add_message(h, generated)
        return Covered("messages", h.hexdigest(), len(self._messages) + 1)

    def _hash_of_first(self, n: int) -> HASH:
        """The running hash after the first n messages (not to be updated by the caller)."""
        done, h = self._running
        if done > n:
            done, h = 0, _messages_hasher()
        for item in self._messages[done:n]:
            _add_message(h, item)
        self._running = (n, h)
        return h


def _text_digest(text: str) -> str:
    return _sha(b"text" + _V + text.encode("utf-8", "surrogatepass"))


def _messages_hasher() -> HASH:
    return hashlib.sha256(b"messages" + _V)


def _add_message(h: HASH, encoded: bytes) -> None:
    # Length-prefixed so that no two different message lists produce the same byte stream.
    h.update(len(encoded).to_bytes(8, "big"))
    h.update(encoded)


def request_not_storable(route: str, body: dict[str, Any]) -> str | None:
    """Why this request's reply cannot be stored for reuse, or None when it can."""
    if _number(body.get("n")) > 1 or _number(body.get("best_of")) > 1:
        return "several choices: which one decode retained is ambiguous"
    if body.get("echo"):
        return "echo returns the prompt in the reply text"
    if body.get("continue_final_message"):
        return "continue_final_message renders the last message without its end of turn"
    if body.get("prompt_embeds") is not None:
        return "prompt embeddings have no comparable history"
    return None


def reply_not_storable(request_body: dict[str, Any], reply: Reply) -> str | None:
    """Why decode's blocks after this reply do not match the next turn's prompt, or None when they do."""
    if reply.choices != 1:
        return "reply has several choices"
    if reply.finish_reason not in ("stop", "length", "tool_calls"):
        return f"finish_reason {reply.finish_reason!r}"
    # A stop string's tokens are in decode's blocks but not in the reply text. A stop token id (int) or EOS is the
    # last sampled token, which has no KV yet, so only a string stop is unsafe; an engine that does not report
    # stop_reason leaves us in doubt.
    stopped_on_token = isinstance(reply.stop_reason, int) and not isinstance(reply.stop_reason, bool)
    if reply.finish_reason == "stop" and request_body.get("stop") and not stopped_on_token:
        return "stopped on a stop string"
    return None


def _number(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0

"""OpenAI's Chat Completions and Completions APIs, as vLLM serves them."""

from __future__ import annotations

from duplex_sidecars.protocol import OPENAI_LEGS
from duplex_sidecars.router.apis.api import Api, FieldCheck, is_int
from duplex_sidecars.router.errors import error_json
from duplex_sidecars.router.history import (
    CHAT_ROUTE,
    COMPLETIONS_ROUTE,
    SCOPE_FIELDS,
    History,
    request_not_storable,
)
from duplex_sidecars.router.relay import StreamShape
from duplex_sidecars.router.reply import ReplyCollector, reply_of_body

_OPTIONS: tuple[FieldCheck, ...] = (
    ("max_tokens", False, is_int, "'max_tokens' must be an integer.", "invalid_type"),
    ("max_completion_tokens", False, is_int, "'max_completion_tokens' must be an integer.", "invalid_type"),
    ("n", False, is_int, "'n' must be an integer.", "invalid_type"),
)
_STREAM: FieldCheck = ("stream", False, lambda v: isinstance(v, bool), "'stream' must be a boolean.", "invalid_type")

CHAT = Api(
    route=CHAT_ROUTE,
    path="/v1/chat/completions",
    checks=(
        _STREAM,
        (
            "messages",
            True,
            lambda v: isinstance(v, list) and bool(v),
            "'messages' is required and must be a non-empty array.",
            "invalid_messages",
        ),
        (
            "messages",
            True,
            lambda v: all(isinstance(m, dict) for m in v),
            "Each message must be an object.",
            "invalid_messages",
        ),
        *_OPTIONS,
    ),
    legs=OPENAI_LEGS,
    history=lambda body: History.of_request(CHAT_ROUTE, body),
    scope_fields=SCOPE_FIELDS,
    not_storable=lambda body: request_not_storable(CHAT_ROUTE, body),
    reply_of_body=lambda body: reply_of_body(CHAT_ROUTE, body),
    collector=lambda: ReplyCollector(CHAT_ROUTE),
    stream=StreamShape(),
    error_body=lambda status, message, type_, code: error_json(status, message, type_, code),
)

COMPLETIONS = Api(
    route=COMPLETIONS_ROUTE,
    path="/v1/completions",
    checks=(_STREAM, ("prompt", True, lambda v: True, "'prompt' is required.", "missing_prompt"), *_OPTIONS),
    legs=OPENAI_LEGS,
    history=lambda body: History.of_request(COMPLETIONS_ROUTE, body),
    scope_fields=SCOPE_FIELDS,
    not_storable=lambda body: request_not_storable(COMPLETIONS_ROUTE, body),
    reply_of_body=lambda body: reply_of_body(COMPLETIONS_ROUTE, body),
    collector=lambda: ReplyCollector(COMPLETIONS_ROUTE),
    stream=StreamShape(),
    error_body=lambda status, message, type_, code: error_json(status, message, type_, code),
)

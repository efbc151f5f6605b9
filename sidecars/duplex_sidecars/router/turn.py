"""One client request as the router reads it: the validated body, the conversation it belongs to (tenant, model,
conversation id, hashed into a store key) and its history and scope for the reuse check."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

from duplex_sidecars.protocol import KV_PARAMS_FIELD
from duplex_sidecars.router import jsonio
from duplex_sidecars.router.config import ConversationConfig
from duplex_sidecars.router.errors import BadRequest, ModelNotFound, PayloadTooLarge
from duplex_sidecars.router.front import Request
from duplex_sidecars.router.history import (
    CHAT_ROUTE,
    COMPLETIONS_ROUTE,
    History,
    scope_digest,
    state_key,
    tenant_of,
)

ROUTES = {"/v1/chat/completions": CHAT_ROUTE, "/v1/completions": COMPLETIONS_ROUTE}
MAX_CONVERSATION_ID_CHARS = 1024
_REQUEST_ID_OK = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.:")


@dataclass
class Turn:
    route: str
    path: str
    body: dict[str, Any]  # what engines see: conversation id and any client kv_transfer_params removed
    model: str
    stream: bool
    request_id: str
    conversation_id: str | None
    key: str | None  # store key; None without a conversation id
    history: History | None
    scope: str
    started: float = field(default_factory=time.perf_counter)
    # False when the body needed the standard library's parser (NaN, integers beyond 64 bits, ...): the legs are then
    # written by it too, so engines get the client's values unchanged, and the history is not compared.
    exact_json: bool = True

    def encode(self, body: dict[str, Any]) -> bytes:
        """A leg's body (built from this turn's body) as JSON."""
        return jsonio.dumps(body, self.exact_json)


def body_of(request: Request, max_bytes: int) -> bytes:
    """The request's body (the server stops reading at its limit; this one may have been lowered since)."""
    if len(request.body) > max_bytes:
        raise PayloadTooLarge(f"Request body of {len(request.body)} bytes exceeds the limit of {max_bytes} bytes.")
    return request.body


def request_id_of(request: Request) -> str:
    """The client's X-Request-Id when it is a sane token, else a fresh one."""
    given = request.headers.get("x-request-id", "")
    if 0 < len(given) <= 128 and _REQUEST_ID_OK.issuperset(given):
        return given
    return os.urandom(16).hex()


def parse_turn(request: Request, raw: bytes, conversation: ConversationConfig, served_models: list[str]) -> Turn:
    path = request.path
    route = ROUTES[path]
    try:
        body, exact = jsonio.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"Request body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise BadRequest("Request body must be a JSON object.", code="invalid_body")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("'model' is required and must be a non-empty string.", code="missing_model")
    if served_models and model not in served_models:
        raise ModelNotFound(model)
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise BadRequest("'stream' must be a boolean.", code="invalid_type")
    if route == CHAT_ROUTE:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("'messages' is required and must be a non-empty array.", code="invalid_messages")
        if not all(isinstance(m, dict) for m in messages):
            raise BadRequest("Each message must be an object.", code="invalid_messages")
    elif body.get("prompt") is None:
        raise BadRequest("'prompt' is required.", code="missing_prompt")
    for field_name in ("max_tokens", "max_completion_tokens", "n"):
        value = body.get(field_name)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            raise BadRequest(f"'{field_name}' must be an integer.", code="invalid_type")

    conversation_id = None
    if conversation.body_field and conversation.body_field in body:
        value = body.pop(conversation.body_field)
        if value is not None and not isinstance(value, str):
            raise BadRequest(f"'{conversation.body_field}' must be a string.", code="invalid_type")
        conversation_id = value or None
    if conversation_id is None and conversation.header:
        conversation_id = request.header(conversation.header) or None
    if conversation_id is not None and len(conversation_id) > MAX_CONVERSATION_ID_CHARS:
        raise BadRequest(f"Conversation id longer than {MAX_CONVERSATION_ID_CHARS} characters.", code="invalid_value")
    # Only the router decides what an engine reads or retains; a client must never steer it.
    body.pop(KV_PARAMS_FIELD, None)

    key = None
    if conversation_id is not None:
        tenant = tenant_of(request.header(conversation.tenant_header))
        key = state_key(tenant, model, conversation_id)
    comparable = key is not None and exact  # digests are taken only of values read exactly
    return Turn(
        route=route,
        path=path,
        body=body,
        model=model,
        stream=stream,
        request_id=request_id_of(request),
        conversation_id=conversation_id,
        key=key,
        history=History.of_request(route, body) if comparable else None,
        scope=scope_digest(route, body) if comparable else "",
        exact_json=exact,
    )

"""One client request as the router reads it: the validated body, the conversation it belongs to (tenant, model,
conversation id, hashed into a store key) and its history and scope for the reuse check."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any, Literal

from duplex_sidecars.protocol import KV_PARAMS_FIELD
from duplex_sidecars.router import jsonio
from duplex_sidecars.router.apis import APIS
from duplex_sidecars.router.apis.api import MODEL_CHECK, Api, check_fields
from duplex_sidecars.router.config import ConversationConfig, GatewayConfig
from duplex_sidecars.router.errors import BadRequest, ModelNotFound, PayloadTooLarge
from duplex_sidecars.router.exchange import Exchange
from duplex_sidecars.router.history import (
    ANONYMOUS_TENANT,
    Covered,
    History,
    gateway_tenant,
    header_tenant,
    history_base,
    history_key,
    key_tenant,
    scope_digest,
    state_key,
)

MAX_CONVERSATION_ID_CHARS = 1024
MAX_GATEWAY_USER_CHARS = 256
_REQUEST_ID_OK = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.:")


@dataclass
class Turn:
    api: Api
    route: str
    path: str
    body: dict[str, Any]  # what engines see: conversation id and any client kv_transfer_params removed
    model: str
    stream: bool
    request_id: str
    conversation_id: str | None
    key: str | None  # the store entry this turn takes; None: nothing to look up (`no_key_reason` says why)
    history: History | None
    scope: str
    started: float = field(default_factory=time.perf_counter)
    # False when the body needed the standard library's parser (NaN, integers beyond 64 bits, ...): the legs are then
    # written by it too, so engines get the client's values unchanged, and the history is not compared.
    exact_json: bool = True
    keying: Literal["id", "history"] | None = "id"  # how this conversation's entries are keyed; None: not stored
    base: str | None = None  # history keying: what every key of this conversation starts from
    no_key_reason: str = "no_conversation_id"
    shared_tenant: bool = False  # the anonymous tenant, shared by every client without a key or Authorization
    receipts: bool = True  # answer with a Server-Timing receipt (router/receipt.py)

    def encode(self, body: dict[str, Any]) -> bytes:
        """A leg's body (built from this turn's body) as JSON."""
        return jsonio.dumps(body, self.exact_json)

    def store_key(self, covered: Covered | None) -> str | None:
        """Where decode's blocks after this turn are stored: under the conversation id, or, keyed by history, under
        the digest of the history they cover (what the next turn looks up)."""
        if self.keying == "id":
            return self.key
        if self.keying == "history" and self.base is not None and covered is not None:
            return history_key(self.base, covered.digest)
        return None


def body_of(request: Exchange, max_bytes: int) -> bytes:
    """The request's body (the server stops reading at its limit; this one may have been lowered since)."""
    if len(request.body) > max_bytes:
        raise PayloadTooLarge(f"Request body of {len(request.body)} bytes exceeds the limit of {max_bytes} bytes.")
    return request.body


def request_id_of(request: Exchange) -> str:
    """The client's X-Request-Id when it is a sane token, else a fresh one."""
    given = request.header("x-request-id") or ""
    if 0 < len(given) <= 128 and _REQUEST_ID_OK.issuperset(given):
        return given
    return os.urandom(16).hex()


def _bad_request(message: str, code: str) -> BadRequest:
    return BadRequest(message, code=code)


def _single_header(request: Exchange, name: str | None) -> str | None:
    """A header that must appear at most once (it names a tenant or a conversation)."""
    if not name:
        return None
    if request.repeated(name):
        raise BadRequest(f"The {name} header must appear at most once.", code="duplicate_header")
    return request.header(name)


def _gateway_user(request: Exchange, header: str) -> str:
    user = _single_header(request, header)
    if not user:
        raise BadRequest(f"A gateway's request must name its user in the {header} header.", code="missing_tenant")
    if len(user) > MAX_GATEWAY_USER_CHARS:
        raise BadRequest(
            f"The {header} header is longer than {MAX_GATEWAY_USER_CHARS} characters.", code="invalid_value"
        )
    return user


def conversation_of(request: Exchange, body: dict[str, Any], conversation: ConversationConfig) -> str | None:
    """The conversation id from the body field (taken out of the body) or else the header; None without one."""
    conversation_id = None
    if conversation.body_field and conversation.body_field in body:
        value = body.pop(conversation.body_field)
        if value is not None and not isinstance(value, str):
            raise BadRequest(f"'{conversation.body_field}' must be a string.", code="invalid_type")
        conversation_id = value or None
    from_header = _single_header(request, conversation.header)
    if conversation_id is None:
        conversation_id = from_header or None
    if conversation_id is not None and len(conversation_id) > MAX_CONVERSATION_ID_CHARS:
        raise BadRequest(f"Conversation id longer than {MAX_CONVERSATION_ID_CHARS} characters.", code="invalid_value")
    return conversation_id


def parse_turn(
    request: Exchange,
    raw: bytes,
    conversation: ConversationConfig,
    served_models: list[str],
    client: str | None = None,
    gateway: GatewayConfig | None = None,
    receipts: bool = True,
) -> Turn:
    """The turn a client request stands for; BadRequest (400) or ModelNotFound (404) when it cannot be served.
    `client` is the name of the API key that authenticated it, when the router checks keys; a key of a `gateway`
    names the user in the gateway's header."""
    api = APIS[request.path]
    route = api.route
    try:
        body, exact = jsonio.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"Request body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise BadRequest("Request body must be a JSON object.", code="invalid_body")
    check_fields(MODEL_CHECK, body, _bad_request)
    model = body["model"]
    if served_models and model not in served_models:
        raise ModelNotFound(model)
    check_fields(api.checks, body, _bad_request)
    conversation_id = conversation_of(request, body, conversation)
    if client is not None and gateway is not None and client in gateway.keys:
        tenant = gateway_tenant(client, _gateway_user(request, gateway.tenant_header))
    elif client is not None:
        tenant = key_tenant(client)  # the key's tenant, whatever else the headers say
    else:
        credentials = [_single_header(request, name) for name in (conversation.tenant_header, *api.tenant_headers)]
        tenant = header_tenant(credentials)
    sessions = [_single_header(request, name) or "" for name in conversation.session_headers]
    # Only the router decides what an engine reads or retains; a client must never steer it.
    body.pop(KV_PARAMS_FIELD, None)

    by_id = conversation_id is not None and conversation.keying != "history"
    by_history = not by_id and conversation.keying != "id"
    # Digests are taken only of values read exactly.
    history = api.history(body) if exact and (by_id or by_history) else None
    scope = scope_digest(route, body, api.scope_fields) if history is not None or (by_id and exact) else ""
    turn = Turn(
        api=api,
        route=route,
        path=request.path,
        body=body,
        model=model,
        stream=bool(body.get("stream")),
        request_id=request_id_of(request),
        conversation_id=conversation_id,
        key=None,
        history=history,
        scope=scope,
        exact_json=exact,
        keying=None,
        shared_tenant=tenant == ANONYMOUS_TENANT,
        receipts=receipts,
    )
    if by_id:
        assert conversation_id is not None
        turn.keying, turn.key = "id", state_key(tenant, model, conversation_id)
    elif by_history and history is not None and history.kind == "messages":
        turn.keying, turn.base = "history", history_base(tenant, model, "\0".join(sessions), scope)
        covered = history.prefix_digest(history.turn_boundary)
        turn.key = history_key(turn.base, covered) if covered is not None else None
        turn.no_key_reason = "no_prior_turn"
    elif by_history and exact:
        turn.no_key_reason = "no_conversation_id"  # a prompt without turns (completions) needs an id
    elif by_history:
        turn.no_key_reason = "not_replayable"
    return turn

"""OpenAI-style error bodies and the exceptions the router raises to produce them.

Every error a client sees has the shape `{"error": {"message", "type", "code"}}`, whatever went wrong.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from duplex_sidecars.router.exchange import Exchange


class RouterError(Exception):
    """An error that ends the request with an OpenAI-style JSON body."""

    status = 500
    type = "server_error"

    def __init__(self, message: str, *, status: int | None = None, type: str | None = None, code: Any = None):
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status
        if type is not None:
            self.type = type
        self.code = code if code is not None else self.status


class BadRequest(RouterError):
    status = 400
    type = "invalid_request_error"


class Unauthorized(RouterError):
    """No client API key, or not one the router knows."""

    status = 401
    type = "invalid_request_error"

    def __init__(self) -> None:
        super().__init__(
            "A valid API key is required (Authorization: Bearer <key>, or x-api-key).", code="invalid_api_key"
        )


class PayloadTooLarge(RouterError):
    status = 413
    type = "invalid_request_error"


class ModelNotFound(RouterError):
    status = 404
    type = "invalid_request_error"

    def __init__(self, model: str):
        super().__init__(f"The model {model!r} does not exist.", code="model_not_found")


class BackendUnavailable(RouterError):
    """No engine of a role can be reached at all (none known, or all refused connections)."""

    status = 503
    type = "service_unavailable"


class BackendFailed(RouterError):
    """An engine answered, but with an error or a broken response."""

    status = 502
    type = "bad_gateway"


def error_body(message: str, type: str, code: Any) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "code": code}}


def error_json(status: int, message: str, type: str = "invalid_request_error", code: Any = None) -> bytes:
    return json.dumps(error_body(message, type, status if code is None else code)).encode()


ErrorBody = Callable[[int, str, str, Any], bytes]  # (status, message, type, code) -> a body in an API's own shape


def send_error(
    request: Exchange,
    status: int,
    message: str,
    type: str = "invalid_request_error",
    code: Any = None,
    headers: dict[str, str] | None = None,
    body: ErrorBody = error_json,
) -> None:
    """Answer with an error, unless the response has started (then the connection's end is the only signal left)."""
    if request.started:
        request.keep_alive = False
        return
    request.respond(status, body(status, message, type, code), headers=headers)


def send_router_error(request: Exchange, err: RouterError, body: ErrorBody = error_json) -> None:
    send_error(request, err.status, err.message, err.type, err.code, body=body)


def sse_error_event(message: str, type: str = "server_error", code: Any = 502) -> bytes:
    """The clean end of a stream that broke after its first byte: one error event, then [DONE]."""
    payload = json.dumps(error_body(message, type, code))
    return f"data: {payload}\n\ndata: [DONE]\n\n".encode()

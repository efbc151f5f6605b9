"""The engine key on every path of a vLLM engine but its health and metrics: an ASGI middleware that vLLM loads with
`--middleware duplex_engine_guard.EngineKeyGuard` from the ConfigMap the operator mounts (children/engine_guard.py).

vLLM's own `--api-key` (VLLM_API_KEY) guards /v1, /v2, /inference and /cohere only: `POST /invocations`, `/tokenize`
and the rest answer anyone who reaches port 8000, such as a scraper's namespace that the engines' NetworkPolicy lets
in for /metrics. Here every other path needs `Authorization: Bearer <VLLM_API_KEY>`, which only the router holds.

It also names the engine's KV revision (DUPLEX_KV_REVISION, set by the operator) on every answer, in the
X-Duplex-KV-Revision header: the router's health probe reads it and pairs prefill and decode of one revision only.

Standard library only: it runs inside the engine image's Python, beside whatever vLLM brings.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

# What the kubelet's probes and a Prometheus scraper need, and nothing else.
OPEN_PATHS = frozenset({"/health", "/metrics"})
KEY_ENV = "VLLM_API_KEY"
# The names of sidecars/duplex_sidecars/protocol.py (KV_REVISION_ENV, KV_REVISION_HEADER), which this module cannot
# import.
REVISION_ENV = "DUPLEX_KV_REVISION"
REVISION_HEADER = "X-Duplex-KV-Revision"
_REFUSED = b'{"error":"Unauthorized"}'


def is_open(path: str) -> bool:
    return path in OPEN_PATHS or path.startswith("/metrics/")


def with_header(send: Send, name: bytes, value: bytes) -> Send:
    """`send`, adding the header to the response's head."""

    async def stamped(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", ()), (name, value)]}
        await send(message)

    return stamped


class EngineKeyGuard:
    """Refuses (401) an HTTP request without the engine key, except on OPEN_PATHS, and a websocket without it. Without
    a key in the environment it guards nothing, as vLLM's own --api-key does. Every HTTP answer, a refusal too, names
    the KV revision when the environment has one."""

    def __init__(self, app: App):
        self.app = app
        key = os.environ.get(KEY_ENV, "")
        self.expected = f"Bearer {key}".encode() if key else None
        self.revision = os.environ.get(REVISION_ENV, "").strip().encode() or None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http" and self.revision is not None:
            send = with_header(send, REVISION_HEADER.lower().encode(), self.revision)
        path = scope.get("path", "").removeprefix(scope.get("root_path", ""))
        if kind not in ("http", "websocket") or self.expected is None or (kind == "http" and is_open(path)):
            await self.app(scope, receive, send)
            return
        presented = [value for name, value in scope.get("headers", ()) if name.lower() == b"authorization"]
        if len(presented) == 1 and hmac.compare_digest(presented[0], self.expected):
            await self.app(scope, receive, send)
            return
        if kind == "websocket":
            await send({"type": "websocket.close", "code": 1008})  # before accept: the server answers 403
            return
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(_REFUSED)).encode())]
        await send({"type": "http.response.start", "status": 401, "headers": headers})
        await send({"type": "http.response.body", "body": _REFUSED})

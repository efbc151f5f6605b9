"""The engine guard (children/duplex_engine_guard.py), as vLLM runs it: an ASGI middleware around the engine's app.
What it lets through reaches vLLM; everything else is a 401 that never touches the app. Real vLLM CPU engines run it
in tests/realvllm/test_engine_key.py."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from duplex.children import engine_guard
from duplex.children.duplex_engine_guard import REVISION_ENV, REVISION_HEADER, EngineKeyGuard

KEY = "k3y"


def call(path: str, *auth: bytes, kind: str = "http", key: str | None = KEY, root: str = "") -> tuple[Any, list[Any]]:
    reached: list[str] = []
    sent: list[Any] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        reached.append(scope["path"])

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b""}

    async def send(message: Any) -> None:
        sent.append(message)

    with pytest.MonkeyPatch.context() as mp:
        if key is None:
            mp.delenv("VLLM_API_KEY", raising=False)
        else:
            mp.setenv("VLLM_API_KEY", key)
        guard = EngineKeyGuard(app)
    headers = [(b"host", b"engine")] + [(b"authorization", a) for a in auth]
    scope = {"type": kind, "path": path, "root_path": root, "method": "POST", "headers": headers}
    asyncio.run(guard(scope, receive, send))
    return reached, sent


@pytest.mark.parametrize("path", ["/health", "/metrics", "/metrics/"])
def test_probes_and_scrapers_need_no_key(path: str) -> None:
    assert call(path) == ([path], [])


@pytest.mark.parametrize("path", ["/invocations", "/tokenize", "/v1/chat/completions", "/load", "/", "/healthz"])
def test_every_other_path_needs_the_engine_key(path: str) -> None:
    reached, sent = call(path)
    assert reached == [] and sent[0]["status"] == 401 and sent[1]["body"] == b'{"error":"Unauthorized"}'
    assert call(path, b"Bearer " + KEY.encode()) == ([path], [])


@pytest.mark.parametrize(
    "auth",
    [(b"Bearer wrong",), (b"bearer " + KEY.encode(),), (KEY.encode(),), (b"Bearer " + KEY.encode(), b"Bearer x")],
    ids=["wrong key", "scheme case", "no scheme", "two headers"],
)
def test_anything_but_exactly_one_right_key_is_refused(auth: tuple[bytes, ...]) -> None:
    reached, sent = call("/invocations", *auth)
    assert reached == [] and sent[0]["status"] == 401


def test_a_root_path_does_not_open_a_path() -> None:
    assert call("/api/invocations", root="/api")[0] == []
    assert call("/api/metrics", root="/api") == (["/api/metrics"], [])


def test_websockets_need_the_key_too() -> None:
    reached, sent = call("/v1/realtime", kind="websocket")
    assert reached == [] and sent == [{"type": "websocket.close", "code": 1008}]


def test_lifespan_and_engines_without_a_key_pass() -> None:
    assert call("", kind="lifespan") == ([""], [])
    assert call("/invocations", key=None) == (["/invocations"], [])


def answered(path: str, revision: str | None, key: str | None = KEY) -> list[Any]:
    """What the guard sent for `path` without a key, around an app that answers 200."""
    sent: list[Any] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"ok"})

    async def send(message: Any) -> None:
        sent.append(message)

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b""}

    with pytest.MonkeyPatch.context() as mp:
        for name, value in (("VLLM_API_KEY", key), (REVISION_ENV, revision)):
            if value is None:
                mp.delenv(name, raising=False)
            else:
                mp.setenv(name, value)
        guard = EngineKeyGuard(app)
    scope = {"type": "http", "path": path, "root_path": "", "method": "GET", "headers": []}
    asyncio.run(guard(scope, receive, send))
    return sent


def test_every_answer_names_the_kv_revision() -> None:
    health = answered("/health", "0a1b2c3d")
    assert health[0]["status"] == 200 and health[1]["body"] == b"ok"
    assert health[0]["headers"] == [(b"content-type", b"text/plain"), (b"x-duplex-kv-revision", b"0a1b2c3d")]
    refused = answered("/invocations", "0a1b2c3d")
    assert refused[0]["status"] == 401 and (b"x-duplex-kv-revision", b"0a1b2c3d") in refused[0]["headers"]
    assert (b"x-duplex-kv-revision", b"0a1b2c3d") in answered("/invocations", "0a1b2c3d", key=None)[0]["headers"]


@pytest.mark.parametrize("revision", [None, ""])
def test_without_a_revision_no_header_is_added(revision: str | None) -> None:
    assert answered("/health", revision)[0]["headers"] == [(b"content-type", b"text/plain")]


def test_the_guard_names_the_revision_as_the_router_reads_it() -> None:
    from duplex_sidecars import protocol

    assert (REVISION_ENV, REVISION_HEADER) == (protocol.KV_REVISION_ENV, protocol.KV_REVISION_HEADER)


def test_the_configmap_carries_the_module_vllm_imports() -> None:
    cm = engine_guard.engine_guard_configmap("demo", "ns")
    module, name = engine_guard.MIDDLEWARE.rsplit(".", 1)
    assert cm["metadata"]["name"] == "demo-guard" and sorted(cm["data"]) == ["duplex_drain.py", f"{module}.py"]
    namespace: dict[str, Any] = {}
    exec(compile(cm["data"][f"{module}.py"], f"{module}.py", "exec"), namespace)  # as the engine's Python would
    assert namespace[name].__name__ == "EngineKeyGuard"
    assert engine_guard.args() == ["--middleware", "duplex_engine_guard.EngineKeyGuard"]

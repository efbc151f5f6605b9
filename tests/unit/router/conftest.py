"""A router in front of fake engines, all in the test's event loop."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest

from duplex_sidecars.router.app import Router, RouterServer
from duplex_sidecars.router.config import RouterConfig
from duplex_sidecars.router.config_file import deep_merge

from .fake_engine import FakeEngine


class Rig:
    def __init__(
        self,
        router: Router,
        server: RouterServer,
        prefill: list[FakeEngine],
        decode: list[FakeEngine],
        session: aiohttp.ClientSession,
    ):
        self.router = router
        self.server = server
        self.prefill = prefill
        self.decode = decode
        self.session = session

    @property
    def p(self) -> FakeEngine:
        return self.prefill[0]

    @property
    def d(self) -> FakeEngine:
        return self.decode[0]

    @property
    def url(self) -> str:
        return self.server.url

    def metric(self, name: str, **labels: str) -> float:
        return self.router.metrics.total(name, **labels)

    async def post(
        self, path: str, body: Any = None, *, data: bytes | None = None, headers: dict[str, str] | None = None
    ) -> tuple[int, Any, dict[str, str]]:
        kwargs: dict[str, Any] = {"headers": headers or {}}
        if data is not None:
            kwargs["data"] = data
        else:
            kwargs["json"] = body
        async with self.session.post(self.url + path, **kwargs) as resp:
            raw = await resp.read()
            ctype = resp.headers.get("Content-Type", "")
            if "event-stream" in ctype:
                return resp.status, parse_sse(raw), dict(resp.headers)
            try:
                return resp.status, json.loads(raw), dict(resp.headers)
            except ValueError:
                return resp.status, raw, dict(resp.headers)

    async def chat(
        self,
        messages: list[dict[str, Any]],
        conv: str | None = "c1",
        stream: bool = False,
        headers: dict[str, str] | None = None,
        **extra: Any,
    ) -> tuple[int, Any, str]:
        body: dict[str, Any] = {"model": "m", "messages": messages, "stream": stream, **extra}
        if conv is not None:
            body["conversation_id"] = conv
        status, out, _ = await self.post("/v1/chat/completions", body, headers=headers)
        return status, out, reply_text(out) if status == 200 else ""


def parse_sse(raw: bytes) -> list[Any]:
    events = []
    for block in raw.decode().split("\n\n"):
        if block.startswith("data: "):
            data = block[6:]
            events.append(data if data == "[DONE]" else json.loads(data))
    return events


def reply_text(out: Any) -> str:
    if isinstance(out, list):
        text = ""
        for event in out:
            if isinstance(event, dict):
                for choice in event.get("choices") or []:
                    text += (choice.get("delta") or {}).get("content") or choice.get("text") or ""
        return text
    choice = out["choices"][0]
    return choice["message"]["content"] if "message" in choice else choice["text"]


RigFactory = Callable[..., Awaitable[Rig]]


@pytest.fixture
async def make_rig() -> AsyncIterator[RigFactory]:
    cleanups: list[Callable[[], Awaitable[None]]] = []

    async def factory(n_prefill: int = 1, n_decode: int = 1, **config: Any) -> Rig:
        prefill = [await FakeEngine(f"p{i}").start() for i in range(n_prefill)]
        decode = [await FakeEngine(f"d{i}").start() for i in range(n_decode)]
        for engine in prefill + decode:
            cleanups.append(engine.close)
        base = {
            "prefill": [e.url for e in prefill],
            "decode": [e.url for e in decode],
            "timeouts": {
                "connect_seconds": 2,
                "prefill_seconds": 5,
                "decode_first_byte_seconds": 5,
                "decode_idle_seconds": 5,
            },
        }
        router = Router(RouterConfig.model_validate(deep_merge(base, config)))
        server = RouterServer(router)
        await server.start()
        cleanups.append(server.close)
        session = aiohttp.ClientSession()
        cleanups.append(session.close)
        return Rig(router, server, prefill, decode, session)

    yield factory
    for cleanup in reversed(cleanups):
        await cleanup()

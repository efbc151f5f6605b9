"""An in-process simulator app for the unit tier: the real engine and HTTP layer with a stand-in for NIXL, enough
for everything but remote KV reads (those run over real NIXL in tests/integration)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from duplex_sidecars.sim.config import SimConfig
from duplex_sidecars.sim.engine import Engine
from duplex_sidecars.sim.http_api import OpenAIApi


class NoNixl:
    """The transport surface a local request touches: no remote agents, no notifications."""

    agent_name = "unit-no-nixl"

    def metadata(self) -> bytes:
        return b""

    async def notifications(self) -> dict[str, list[bytes]]:
        return {}

    def close(self) -> None:
        pass


@asynccontextmanager
async def sim_client(**config: Any) -> AsyncIterator[TestClient[Any, Any]]:
    engine = Engine(SimConfig(**config), transport=NoNixl())  # type: ignore[arg-type]
    await engine.start()
    client = TestClient(TestServer(OpenAIApi(engine).app()))
    await client.start_server()
    try:
        yield client
    finally:
        await client.close()
        await engine.stop()


def sse_events(raw: bytes) -> list[tuple[str, Any]]:
    """(event name, decoded data) of each frame; every frame is exactly an `event:` and a `data:` line."""
    out = []
    for frame in raw.decode().split("\n\n")[:-1]:
        head, data = frame.split("\n")
        assert head.startswith("event: ") and data.startswith("data: "), frame
        out.append((head[len("event: ") :], json.loads(data[len("data: ") :])))
    return out

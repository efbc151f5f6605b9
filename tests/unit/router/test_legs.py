"""Reading a leg's response body: one idle timer per stream that fires only on a real gap while the router waits."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from duplex_sidecars.http1.client import EngineClient, EngineResponse
from duplex_sidecars.router.legs import TIMEOUT, ChunkReader, LegFailure

# A body as (seconds to wait, bytes to send) steps.
Script = list[tuple[float, bytes]]


@pytest.fixture
async def body_of() -> AsyncIterator[Callable[[Script], Awaitable[EngineResponse]]]:
    """Open a response whose body follows the script."""
    servers: list[TestServer] = []
    client = EngineClient()
    responses: list[EngineResponse] = []

    async def open_(script: Script) -> EngineResponse:
        async def handler(request: web.Request) -> web.StreamResponse:
            resp = web.StreamResponse()
            await resp.prepare(request)
            for delay, data in script:
                await asyncio.sleep(delay)
                await resp.write(data)
            await resp.write_eof()
            return resp

        app = web.Application()
        app.router.add_post("/", handler)
        server = TestServer(app)
        await server.start_server()
        servers.append(server)
        resp = await client.post(str(server.make_url("")).rstrip("/"), "/", b"{}", {}, 5)
        open_.client = client  # type: ignore[attr-defined]
        responses.append(resp)
        return resp

    yield open_
    for resp in responses:
        resp.close()
    await client.close()
    for server in servers:
        await server.close()


async def read_all(reader: ChunkReader) -> bytes:
    out = b""
    while chunk := await reader.read():
        out += chunk
    return out


async def test_a_gap_longer_than_the_idle_time_fails_the_read(body_of):
    resp = await body_of([(0, b"a"), (5, b"b")])
    reader = ChunkReader(resp, 0.2)
    try:
        assert await reader.read() == b"a"
        started = time.perf_counter()
        with pytest.raises(LegFailure) as failure:
            await reader.read()
        assert failure.value.kind == TIMEOUT
        assert 0.19 <= time.perf_counter() - started < 1.0
    finally:
        reader.close()


async def test_gaps_shorter_than_the_idle_time_never_fail(body_of):
    resp = await body_of([(0.15, b"x")] * 10)  # 1.5 s in all, beyond the idle time; each gap far below it
    reader = ChunkReader(resp, 1.0)
    try:
        assert await read_all(reader) == b"x" * 10
    finally:
        reader.close()


async def test_time_spent_away_from_the_read_does_not_count(body_of):
    # The router writing to a slow client is not the engine going quiet.
    resp = await body_of([(0, b"a"), (0.1, b"b"), (0.1, b"c")])
    reader = ChunkReader(resp, 0.2)
    try:
        assert await reader.read() == b"a"
        await asyncio.sleep(0.6)
        assert await read_all(reader) == b"bc"
    finally:
        reader.close()


async def test_a_closed_reader_leaves_the_response_alone(body_of):
    resp = await body_of([(0, b"a"), (0.5, b"b")])
    reader = ChunkReader(resp, 0.1)
    assert await reader.read() == b"a"
    reader.close()
    await asyncio.sleep(0.3)
    assert resp.exception() is None
    assert await resp.read() == b"b"


async def test_a_finished_stream_gives_its_connection_back_when_its_body_ends(body_of):
    resp = await body_of([(0, b"data: [DONE]\n\n"), (0.2, b"")])  # the body's end comes in its own write
    client = body_of.client
    reader = ChunkReader(resp, 1)
    assert await reader.read() == b"data: [DONE]\n\n"
    reader.finish(5)  # returns at once
    assert client.connections() == (0, 1)
    await asyncio.sleep(0.5)
    assert not resp.closed
    assert client.connections() == (1, 0)  # back in the pool, reusable


async def test_a_stream_whose_body_does_not_end_is_closed_after_a_while(body_of):
    resp = await body_of([(0, b"a"), (3, b"b")])
    reader = ChunkReader(resp, 5)
    assert await reader.read() == b"a"
    reader.finish(0.2)
    assert not resp.closed
    await asyncio.sleep(0.5)
    assert resp.closed


async def test_a_broken_stream_is_closed_at_once(body_of):
    resp = await body_of([(0, b"a"), (3, b"b")])
    reader = ChunkReader(resp, 0.1)
    assert await reader.read() == b"a"
    with pytest.raises(LegFailure):
        await reader.read()
    reader.finish(5)
    assert resp.closed

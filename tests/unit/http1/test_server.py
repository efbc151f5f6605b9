"""FrontServer (the router's client-facing HTTP/1.1 server) against raw clients on loopback: every byte a client sends,
and when, is chosen by the test; answers are read off the wire (or through aiohttp's client where its decoding is the
point)."""

from __future__ import annotations

import asyncio
import email.utils
import hashlib
import json
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from duplex_dev.uvicorn_front import UvicornFront
from duplex_sidecars.http1 import server as front
from duplex_sidecars.http1.server import (
    MAX_HEAD_BYTES,
    ClientGone,
    FrontServer,
    Limits,
    Request,
)

from .rawhttp import HeaderLookup, until

# ---- a server and raw clients -----------------------------------------------------------------------------------


def error_body(status: int, message: str) -> bytes:
    return json.dumps({"error": {"status": status, "message": message}}).encode()


Handler = Callable[[Request], Awaitable[None]]
ServerFactory = Callable[..., Awaitable[FrontServer]]


# How long to wait for what must happen soon: generous, so that a loaded machine is no failure. It never bounds
# what must not happen (those waits stay short and explicit).
PATIENCE = 5.0

SERVERS = {"duplex": FrontServer, "uvicorn": UvicornFront}

# Where uvicorn, the reference, behaves otherwise on the same case (strict: a case that starts to pass must leave this
# list). docs/architecture.md ("The HTTP layer") sums these up.
UVICORN_DIFFERS = {
    "test_header_value_with_a_line_break_is_a_500": "drops the connection instead of answering 500",
    "test_standard_response_headers": "its own Server header",
    "test_http10_without_keep_alive_closes_after_the_response": "ASGI does not tell the app the connection's fate",
    "test_http10_with_keep_alive_stays_open": "closes HTTP/1.0 connections despite Connection: keep-alive",
    "test_connection_close_is_honoured": "ASGI does not tell the app the connection's fate",
    "test_100_continue_for_a_pipelined_request_waits_for_the_response_before_it": "sends 100 Continue at once",
    "test_malformed_or_oversized_head_is_answered_then_closed": "plain-text 400s and no head size limit (no 431)",
    "test_unterminated_header_line_over_the_limit_is_refused": "no head size limit",
    "test_stream_first_data_goes_out_with_the_head": "lower-case header names, head and first chunk apart",
    "test_http10_stream_is_unframed_and_ends_with_the_connection": "sends chunked encoding to HTTP/1.0 clients",
    "test_stream_left_open_ends_with_the_connection": "the adapter ends an abandoned stream cleanly",
    "test_stream_failing_midway_is_cut_not_terminated": "the adapter ends a failed stream cleanly",
    "test_idle_connection_is_closed_after_idle_seconds": "keep-alive timeout in whole seconds",
    "test_stop_cancels_a_handler_that_outlives_the_grace": "graceful shutdown in whole seconds, at least 1",
    "test_a_trickled_request_meets_its_deadline": "no deadline for a request's head or body",
    "test_the_connection_cap_answers_503_and_keeps_serving_the_others": "its cap counts connections and tasks together",
    "test_a_client_that_never_reads_is_cut_and_all_it_held_is_freed": "no deadline for a client that stops reading",
    "test_a_whole_answer_nobody_reads_does_not_hold_the_connection": "no deadline for a client that stops reading",
    "test_a_repeated_host_is_400": "accepts a second Host",
    "test_trailer_fields_never_become_request_headers": "the adapter sees trailer fields among the headers",
    "test_header_fields_over_the_cap_are_431": "no cap on header fields",
    "test_a_flood_of_repeated_headers_is_431_at_once": "no cap on header fields",
    "test_the_head_limit_counts_raw_bytes_with_their_separators": "no head size limit",
    "test_bodies_held_across_connections_are_bounded": "no bound on the request bodies held at once",
    "test_a_chunked_body_is_counted_as_it_comes": "no bound on the request bodies held at once",
    "test_a_head_the_application_refuses_is_answered_before_its_body": "no hook at the end of a head",
    "test_one_client_address_cannot_take_every_connection": "no cap on the connections of one client address",
}


@pytest.fixture(params=list(SERVERS))
async def make_server(request) -> AsyncIterator[ServerFactory]:
    """The router's own server, and uvicorn behind the same contract as a reference (the same cases run on both)."""
    differs = UVICORN_DIFFERS.get(request.node.originalname)
    if request.param == "uvicorn" and differs:
        request.applymarker(pytest.mark.xfail(strict=True, reason=f"uvicorn: {differs}"))
    servers: list[FrontServer] = []

    async def factory(
        handler: Handler, *, max_body: Callable[[], int] = lambda: 1000, idle: float = 5.0, **limits: Any
    ) -> FrontServer:
        server = SERVERS[request.param](handler, Limits(max_body, idle_seconds=idle, **limits), error_body)
        await server.start("127.0.0.1", 0)
        servers.append(server)
        return server

    yield factory
    for server in servers:
        await server.stop(0.5)


@dataclass
class Reply(HeaderLookup):
    status: int
    reason: str
    headers: list[tuple[str, str]]
    body: bytes
    chunks: list[bytes] | None  # the chunks as framed, for a chunked body

    def json(self) -> Any:
        return json.loads(self.body)


class Client:
    """One raw connection."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, port: int, rcvbuf: int | None = None, source: str | None = None) -> Client:
        if rcvbuf is None:
            local = (source, 0) if source else None
            reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=local)
        else:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)  # before connect: the window stays small
            sock.setblocking(False)
            await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
            reader, writer = await asyncio.open_connection(sock=sock, limit=1 << 16)
        return cls(reader, writer)

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await asyncio.wait_for(self.writer.drain(), PATIENCE)

    async def reply(self, head_only: bool = False, timeout: float = PATIENCE) -> Reply:
        return await asyncio.wait_for(self._reply(head_only), timeout)

    async def _reply(self, head_only: bool) -> Reply:
        head = await self.reader.readuntil(b"\r\n\r\n")
        lines = head[:-4].decode("latin-1").split("\r\n")
        version, status, reason = lines[0].split(" ", 2)
        assert version == "HTTP/1.1", lines[0]
        headers = []
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            assert sep, f"bad header line {line!r}"
            headers.append((name, value.strip()))
        reply = Reply(int(status), reason, headers, b"", None)
        if head_only or reply.status < 200:
            return reply
        if (reply.header("Transfer-Encoding") or "").lower() == "chunked":
            reply.chunks = []
            while True:
                size_line = (await self.reader.readuntil(b"\r\n"))[:-2]
                try:
                    size = int(size_line, 16)
                except ValueError:
                    raise AssertionError(f"bad chunk size line {size_line!r} after {reply.chunks!r}") from None
                if size == 0:
                    assert await self.reader.readexactly(2) == b"\r\n"  # no trailers
                    break
                data = await self.reader.readexactly(size + 2)
                assert data[-2:] == b"\r\n", "chunk not followed by CRLF"
                reply.chunks.append(data[:-2])
            reply.body = b"".join(reply.chunks)
        elif (length := reply.header("Content-Length")) is not None:
            reply.body = await self.reader.readexactly(int(length))
        else:
            reply.body = await self.reader.read()  # to the end of the connection
        return reply

    async def closed(self, timeout: float = 1.0) -> bool:
        """True if the server ends the connection (EOF or reset) within `timeout` with no more bytes sent; False if
        it is still open."""
        try:
            data = await asyncio.wait_for(self.reader.read(1 << 16), timeout)
        except TimeoutError:
            return False
        except ConnectionError:
            return True
        assert data == b"", f"unexpected bytes instead of the end: {data[:200]!r}"
        return True

    def close(self) -> None:
        self.writer.close()


@pytest.fixture
async def connect() -> AsyncIterator[Callable[..., Awaitable[Client]]]:
    clients: list[Client] = []

    async def open_(server: FrontServer, rcvbuf: int | None = None, source: str | None = None) -> Client:
        client = await Client.open(server.port, rcvbuf, source)
        clients.append(client)
        return client

    yield open_
    for client in clients:
        client.writer.transport.abort()


def describe(request: Request) -> bytes:
    return json.dumps(
        {
            "method": request.method,
            "path": request.path,
            "query": request.query,
            "headers": request.headers,
            "body": request.body.decode("latin-1"),
            "http11": request.http11,
            "keep_alive": request.keep_alive,
        }
    ).encode()


class Recording:
    """A handler that answers 200 with an empty body and records the paths it was called for."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def __call__(self, request: Request) -> None:
        self.calls.append(request.path)
        request.respond(200, b"")


async def echo(request: Request) -> None:
    request.respond(200, describe(request))


def get(path: str = "/", *headers: bytes, version: bytes = b"1.1", method: bytes = b"GET") -> bytes:
    return b"%s %s HTTP/%s\r\nHost: t\r\n%s\r\n" % (
        method,
        path.encode(),
        version,
        b"".join(h + b"\r\n" for h in headers),
    )


def post(path: str, body: bytes, *headers: bytes) -> bytes:
    return get(path, b"Content-Length: %d" % len(body), *headers, method=b"POST") + body


def chunked(*pieces: bytes, end: bool = True) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + (b"0\r\n\r\n" if end else b"")


# ---- requests as the handler sees them --------------------------------------------------------------------------


async def test_request_fields(make_server, connect):
    server = await make_server(echo)
    client = await connect(server)
    await client.send(
        b"PUT /v1/x%20y?a=1&b=2 HTTP/1.1\r\nHost: t\r\nX-Multi: one\r\nX-MULTI: two\r\n"
        b"Content-Type: text/plain\r\nContent-Length: 5\r\n\r\nhello"
    )
    reply = await client.reply()
    assert reply.status == 200
    seen = reply.json()
    assert seen["method"] == "PUT"
    assert seen["path"] == "/v1/x%20y"
    assert seen["query"] == "a=1&b=2"
    assert seen["headers"]["x-multi"] == "one, two"
    assert seen["headers"]["content-type"] == "text/plain"
    assert all(name == name.lower() for name in seen["headers"])
    assert seen["body"] == "hello"
    assert seen["http11"] is True and seen["keep_alive"] is True


async def test_response_headers_from_the_handler(make_server, connect):
    async def handler(request: Request) -> None:
        assert request.header("X-Case") == "v"  # case-insensitive lookup
        request.respond(201, b"made", "text/plain", {"X-Thing": "value", "Location": "/made/1"})

    server = await make_server(handler)
    client = await connect(server)
    await client.send(get("/", b"x-case: v"))
    reply = await client.reply()
    assert (reply.status, reply.reason) == (201, "Created")
    assert reply.header("Content-Type") == "text/plain"
    assert reply.header("X-Thing") == "value"
    assert reply.header("Location") == "/made/1"
    assert reply.body == b"made"


async def _respond_with_injected_header(request: Request) -> None:
    request.respond(200, b"x", headers={"X-Evil": "a\r\nSet-Cookie: pwned=1"})


async def test_header_value_with_a_line_break_never_reaches_the_wire(make_server, connect):
    server = await make_server(_respond_with_injected_header)
    client = await connect(server)
    await client.send(get())
    everything = await asyncio.wait_for(client.reader.read(), PATIENCE)
    assert b"pwned" not in everything and b"X-Evil" not in everything


async def test_header_value_with_a_line_break_is_a_500(make_server, connect):
    server = await make_server(_respond_with_injected_header)
    client = await connect(server)
    await client.send(get())
    reply = await client.reply()
    assert reply.status == 500
    assert reply.header("Set-Cookie") is None and reply.header("X-Evil") is None


# ---- keep-alive -------------------------------------------------------------------------------------------------


async def test_keep_alive_serves_several_requests_on_one_connection(make_server, connect):
    server = await make_server(echo)
    client = await connect(server)
    for i in range(3):
        await client.send(post(f"/r{i}", b"body%d" % i))
        reply = await client.reply()
        assert reply.status == 200
        assert reply.json()["path"] == f"/r{i}"
        assert reply.json()["body"] == f"body{i}"
        assert reply.header("Connection") is None
    assert not await client.closed(0.05)


async def test_standard_response_headers(make_server, connect):
    server = await make_server(echo)
    client = await connect(server)
    await client.send(get("/x"))
    reply = await client.reply()
    assert reply.header("Server") == "duplex-router"
    assert reply.header("Content-Length") == str(len(reply.body))
    assert reply.header("Content-Type") == "application/json"
    date = email.utils.parsedate_to_datetime(reply.header("Date"))
    assert abs(date.timestamp() - time.time()) < 5
    assert reply.header("Date").endswith("GMT")


async def test_http10_without_keep_alive_closes_after_the_response(make_server, connect):
    server = await make_server(echo)
    client = await connect(server)
    await client.send(get("/old", version=b"1.0"))
    reply = await client.reply()
    assert reply.status == 200
    assert reply.json()["http11"] is False and reply.json()["keep_alive"] is False
    assert reply.header("Connection") == "close"
    assert await client.closed()


async def test_http10_with_keep_alive_stays_open(make_server, connect):
    server = await make_server(echo)
    client = await connect(server)
    for path in ("/a", "/b"):
        await client.send(get(path, b"Connection: keep-alive", version=b"1.0"))
        reply = await client.reply()
        assert reply.json()["path"] == path
        assert reply.header("Connection") is None
    assert not await client.closed(0.05)


async def test_connection_close_is_honoured(make_server, connect):
    server = await make_server(echo)
    client = await connect(server)
    await client.send(get("/", b"Connection: close") + b"\r\n")  # a stray CRLF after it is tolerated
    reply = await client.reply()
    assert reply.status == 200
    assert reply.json()["keep_alive"] is False
    assert reply.header("Connection") == "close"
    assert await client.closed()


async def test_head_gets_the_headers_without_the_body(make_server, connect):
    async def handler(request: Request) -> None:
        request.respond(200, b"0123456789", "text/plain")

    server = await make_server(handler)
    client = await connect(server)
    await client.send(get("/", method=b"HEAD"))
    head = await client.reply(head_only=True)
    assert head.status == 200
    assert head.header("Content-Length") == "10"
    # no body bytes follow: the next response on the connection starts right away
    await client.send(get("/"))
    reply = await client.reply()
    assert reply.body == b"0123456789"


async def test_head_of_a_stream_has_no_body_and_keeps_the_connection(make_server, connect):
    async def handler(request: Request) -> None:
        request.start(200, {"Content-Type": "text/plain"}, b"first")
        request.write(b"more")
        request.end(b"last")

    server = await make_server(handler)
    client = await connect(server)
    await client.send(get("/", method=b"HEAD"))
    head = await client.reply(head_only=True)
    assert head.status == 200
    await client.send(get("/"))
    reply = await client.reply()
    assert reply.body == b"firstmorelast"


# ---- pipelining -------------------------------------------------------------------------------------------------


async def test_pipelined_requests_are_answered_in_order_one_at_a_time(make_server, connect):
    events: list[str] = []

    async def handler(request: Request) -> None:
        events.append(f"start {request.path}")
        if request.path == "/slow":
            await asyncio.sleep(0.05)
        events.append(f"end {request.path}")
        request.respond(200, request.path.encode(), "text/plain")

    server = await make_server(handler)
    client = await connect(server)
    await client.send(get("/slow") + get("/fast"))
    first = await client.reply()
    second = await client.reply()
    assert (first.body, second.body) == (b"/slow", b"/fast")
    assert events == ["start /slow", "end /slow", "start /fast", "end /fast"]


async def test_many_pipelined_requests_in_one_write_are_all_answered_in_order(make_server, connect):
    active = 0

    async def handler(request: Request) -> None:
        nonlocal active
        active += 1
        assert active == 1
        await asyncio.sleep(0)
        active -= 1
        request.respond(200, request.path.encode(), "text/plain")

    server = await make_server(handler)
    client = await connect(server)
    n = front.MAX_QUEUED * 3  # past the point where the server stops reading ahead
    await client.send(b"".join(post(f"/{i}", b"x" * i) for i in range(n)))
    bodies = [(await client.reply()).body for _ in range(n)]
    assert bodies == [f"/{i}".encode() for i in range(n)]
    assert not await client.closed(0.05)


@pytest.mark.parametrize(
    "first", [get("/first", b"Connection: close"), get("/first", version=b"1.0")], ids=["connection-close", "http10"]
)
async def test_pipelined_request_after_a_closing_one_is_not_served(make_server, connect, first):
    seen: list[str] = []

    async def handler(request: Request) -> None:
        seen.append(request.path)
        request.respond(200, b"")

    server = await make_server(handler)
    client = await connect(server)
    await client.send(first + get("/second"))
    assert (await client.reply()).header("Connection") == "close"
    assert await client.closed()
    assert seen == ["/first"]


# ---- request bodies ---------------------------------------------------------------------------------------------


async def test_content_length_body_arrives_whole(make_server, connect):
    server = await make_server(echo)
    client = await connect(server)
    body = bytes(range(33, 127)) * 10  # 940 bytes, under the limit of 1000
    wire = post("/", body)
    split = len(wire) - len(body) + 100  # the head and part of the body, then the rest
    await client.send(wire[:split])
    await asyncio.sleep(0.01)
    await client.send(wire[split:])
    reply = await client.reply()
    assert reply.json()["body"].encode() == body


async def test_chunked_body_arrives_whole(make_server, connect):
    server = await make_server(echo)
    client = await connect(server)
    await client.send(
        get("/", b"Transfer-Encoding: chunked", method=b"POST") + chunked(b"hello ", b"chunked", end=False)
    )
    await asyncio.sleep(0.01)
    await client.send(chunked(b" world"))
    reply = await client.reply()
    assert reply.json()["body"] == "hello chunked world"
    assert reply.json()["headers"]["transfer-encoding"] == "chunked"


@pytest.mark.parametrize("framing", ["length", "chunked"])
async def test_body_exactly_at_the_limit_is_accepted(make_server, connect, framing):
    server = await make_server(echo)
    client = await connect(server)
    body = b"b" * 1000
    if framing == "length":
        await client.send(post("/", body))
    else:
        await client.send(get("/", b"Transfer-Encoding: chunked", method=b"POST") + chunked(body[:600], body[600:]))
    reply = await client.reply()
    assert reply.status == 200
    assert reply.json()["body"].encode() == body


async def test_content_length_over_the_limit_is_answered_413_before_the_body(make_server, connect):
    handler = Recording()
    server = await make_server(handler)
    client = await connect(server)
    await client.send(get("/big", b"Content-Length: 1001", method=b"POST"))  # headers only
    reply = await client.reply()
    assert reply.status == 413
    assert reply.header("Connection") == "close"
    assert reply.header("Content-Type") == "application/json"
    assert reply.json()["error"]["status"] == 413
    assert "1001" in reply.json()["error"]["message"]
    await client.send(b"x" * 1001)  # the body, sent after the answer, is read and dropped
    assert await client.closed()
    assert handler.calls == []


async def test_413_is_sent_instead_of_100_continue(make_server, connect):
    server = await make_server(echo)
    client = await connect(server)
    await client.send(get("/", b"Content-Length: 5000", b"Expect: 100-continue", method=b"POST"))
    reply = await client.reply()
    assert reply.status == 413
    await client.send(b"x" * 5000)
    assert await client.closed()


async def test_chunked_body_over_the_limit_is_answered_413(make_server, connect):
    handler = Recording()
    server = await make_server(handler)
    client = await connect(server)
    await client.send(
        get("/", b"Transfer-Encoding: chunked", method=b"POST") + chunked(b"a" * 600, b"b" * 600, end=False)
    )
    reply = await client.reply()
    assert reply.status == 413
    assert reply.header("Connection") == "close"
    assert reply.json()["error"]["status"] == 413
    await client.send(chunked(b"c" * 10))  # the rest of the body and its end
    assert await client.closed()
    assert handler.calls == []


async def test_oversized_pipelined_body_is_answered_413_in_turn(make_server, connect):
    release = asyncio.Event()
    calls: list[str] = []

    async def handler(request: Request) -> None:
        calls.append(request.path)
        if request.path == "/slow":
            await release.wait()
        request.respond(200, request.path.encode(), "text/plain")

    server = await make_server(handler)
    client = await connect(server)
    await client.send(get("/slow") + post("/big", b"x" * 2000) + get("/after"))
    await until(lambda: calls == ["/slow"])
    release.set()
    first = await client.reply()
    assert (first.status, first.body) == (200, b"/slow")
    second = await client.reply()
    assert second.status == 413
    assert second.header("Connection") == "close"
    assert await client.closed()
    assert calls == ["/slow"]


def held_bodies(server: FrontServer) -> int:
    return getattr(server, "held_bodies", 0)  # uvicorn keeps no count


async def test_bodies_held_across_connections_are_bounded(make_server, connect):
    # Before: each connection could hold max_body per request, with nothing bounding them together (issue 23).
    release = asyncio.Event()
    running: list[int] = []

    async def handler(request: Request) -> None:
        running.append(len(request.body))
        await release.wait()
        request.respond(200, b"")

    server = await make_server(handler, max_body=lambda: 1000, max_held_bodies=1500)
    first, second, third = await connect(server), await connect(server), await connect(server)
    await first.send(post("/", b"a" * 800))
    await until(lambda: running == [800])
    await second.send(post("/", b"b" * 800))  # 800 + 800 > 1500: refused at its head, its body dropped
    refused = await second.reply()
    assert refused.status == 503 and refused.header("Retry-After") == "1"
    assert await second.closed()
    await third.send(post("/", b"c" * 600))  # 800 + 600 fits
    await until(lambda: running == [800, 600])
    assert held_bodies(server) == 1400
    release.set()
    assert (await first.reply()).status == (await third.reply()).status == 200
    await until(lambda: held_bodies(server) == 0)


async def test_a_chunked_body_is_counted_as_it_comes(make_server, connect):
    server = await make_server(Recording(), max_body=lambda: 1000, max_held_bodies=500)
    client = await connect(server)
    await client.send(get("/", b"Transfer-Encoding: chunked", method=b"POST") + chunked(b"x" * 300, end=False))
    await client.send(chunked(b"y" * 300))
    reply = await client.reply()
    assert reply.status == 503 and reply.header("Retry-After") == "1"
    assert await client.closed()
    assert held_bodies(server) == 0


async def test_a_client_that_leaves_mid_body_gives_back_what_it_reserved(make_server, connect):
    server = await make_server(Recording(), max_body=lambda: 1000, max_held_bodies=1000)
    client = await connect(server)
    await client.send(get("/", b"Content-Length: 900", method=b"POST") + b"z" * 100)
    if isinstance(server, FrontServer):
        await until(lambda: held_bodies(server) == 900)
    client.writer.transport.abort()
    await until(lambda: held_bodies(server) == 0)
    again = await connect(server)
    await again.send(post("/", b"w" * 900))
    assert (await again.reply()).status == 200


async def test_a_head_the_application_refuses_is_answered_before_its_body(make_server, connect):
    handler = Recording()

    def admit(method: str, path: str, headers: Any) -> tuple[int, bytes] | None:
        return (401, b'{"error":"no key"}') if headers.get("authorization") != "Bearer k" else None

    server = await make_server(handler, max_body=lambda: 1000, max_held_bodies=1000, admit=admit)
    client = await connect(server)
    await client.send(get("/", b"Content-Length: 900", method=b"POST"))  # the head only: no body byte sent yet
    refused = await client.reply()
    assert (refused.status, refused.body) == (401, b'{"error":"no key"}') and refused.header("Connection") == "close"
    assert held_bodies(server) == 0
    await client.send(b"x" * 900)  # the body, read and dropped
    assert await client.closed()
    keyed = await connect(server)
    await keyed.send(post("/", b"y" * 900, b"Authorization: Bearer k"))
    assert (await keyed.reply()).status == 200 and handler.calls == ["/"]


async def test_body_limit_is_read_per_request(make_server, connect):
    limit = [1000]
    server = await make_server(echo, max_body=lambda: limit[0])
    client = await connect(server)
    await client.send(post("/", b"x" * 500))
    assert (await client.reply()).status == 200
    limit[0] = 100
    await client.send(get("/", b"Content-Length: 500", method=b"POST"))
    assert (await client.reply()).status == 413
    limit[0] = 10_000
    client = await connect(server)
    await client.send(post("/", b"y" * 5000))
    reply = await client.reply()
    assert reply.status == 200
    assert len(reply.json()["body"]) == 5000


# ---- Expect: 100-continue ---------------------------------------------------------------------------------------


async def test_expect_100_continue(make_server, connect):
    calls: list[str] = []

    async def handler(request: Request) -> None:
        calls.append(request.path)
        await echo(request)

    server = await make_server(handler)
    client = await connect(server)
    await client.send(get("/up", b"Content-Length: 7", b"Expect: 100-continue", method=b"POST"))
    interim = await client.reply()
    assert (interim.status, interim.reason, interim.headers) == (100, "Continue", [])
    assert calls == []
    await client.send(b"payload")
    reply = await client.reply()
    assert reply.status == 200
    assert reply.json()["body"] == "payload"
    # and the connection carries on
    await client.send(get("/next"))
    assert (await client.reply()).json()["path"] == "/next"


async def test_100_continue_for_a_pipelined_request_waits_for_the_response_before_it(make_server, connect):
    release = asyncio.Event()
    heads = 0

    def max_body() -> int:  # called when a request's head is complete
        nonlocal heads
        heads += 1
        return 1000

    async def handler(request: Request) -> None:
        if request.path == "/stream":
            request.start(200, {"Content-Type": "text/plain"}, b"first")
            await release.wait()
            request.end(b"last")
        else:
            await echo(request)

    server = await make_server(handler, max_body=max_body)
    client = await connect(server)
    await client.send(get("/stream"))
    await asyncio.wait_for(client.reader.readuntil(b"5\r\nfirst\r\n"), PATIENCE)
    await client.send(get("/up", b"Content-Length: 3", b"Expect: 100-continue", method=b"POST"))
    await until(lambda: heads == 2)
    release.set()
    rest = await asyncio.wait_for(client.reader.readuntil(b"0\r\n\r\n"), PATIENCE)
    assert rest == b"4\r\nlast\r\n0\r\n\r\n"  # the streamed response, uncorrupted
    assert (await client.reply()).status == 100
    await client.send(b"abc")
    assert (await client.reply()).json()["body"] == "abc"


# ---- malformed requests -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "request_bytes, status",
    [
        pytest.param(b"THIS IS NOT HTTP\r\n\r\n", 400, id="request-line"),
        pytest.param(b"GET / HTTP/1.1\r\nNo colon here\r\n\r\n", 400, id="header-line"),
        pytest.param(b"GET / HTTP/9.9\r\n\r\n", 400, id="version"),
        pytest.param(
            b"POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
            400,
            id="length-and-chunked",
        ),
        pytest.param(
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n", 400, id="chunk-size"
        ),
        pytest.param(b"GET /" + b"u" * MAX_HEAD_BYTES + b" HTTP/1.1\r\n\r\n", 431, id="head-over-limit-url"),
        pytest.param(
            b"GET / HTTP/1.1\r\nX-Big: " + b"v" * MAX_HEAD_BYTES + b"\r\n\r\n", 431, id="head-over-limit-one-header"
        ),
        pytest.param(
            b"GET / HTTP/1.1\r\n" + b"".join(b"X-H%d: %s\r\n" % (i, b"v" * 40) for i in range(1700)) + b"\r\n",
            431,
            id="head-over-limit-many-headers",
        ),
    ],
)
async def test_malformed_or_oversized_head_is_answered_then_closed(make_server, connect, request_bytes, status):
    handler = Recording()
    server = await make_server(handler)
    client = await connect(server)
    await client.send(request_bytes)
    reply = await client.reply()
    assert reply.status == status
    assert reply.header("Connection") == "close"
    assert reply.json()["error"]["status"] == status
    assert await client.closed()
    assert handler.calls == []


async def test_head_just_under_the_limit_is_served(make_server, connect):
    server = await make_server(echo)
    client = await connect(server)
    await client.send(b"GET / HTTP/1.1\r\nHost: t\r\nX-Big: " + b"v" * (MAX_HEAD_BYTES - 100) + b"\r\n\r\n")
    reply = await client.reply()
    assert reply.status == 200
    assert len(reply.json()["headers"]["x-big"]) == MAX_HEAD_BYTES - 100


async def test_unterminated_header_line_over_the_limit_is_refused(make_server, connect):
    server = await make_server(echo)
    client = await connect(server)
    await client.send(b"GET / HTTP/1.1\r\nX-Big: " + b"v" * (4 * MAX_HEAD_BYTES))  # and the line goes on
    reply = await client.reply(timeout=PATIENCE)
    assert reply.status == 431
    assert await client.closed()


@pytest.mark.parametrize("method", [b"GET", b"POST"])
async def test_upgrade_request_gets_an_answer(make_server, connect, method):
    # what `curl --http2 http://...` sends: a plain HTTP/1.1 request offering an upgrade to h2c
    server = await make_server(echo)
    client = await connect(server)
    await client.send(
        get(
            "/",
            b"Connection: Upgrade, HTTP2-Settings",
            b"Upgrade: h2c",
            b"HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA",
            b"Content-Length: 0",
            method=method,
        )
    )
    reply = await client.reply()
    assert reply.status in (200, 400)  # served over HTTP/1.1 (the upgrade ignored), or refused as the code intends


# ---- streamed responses -----------------------------------------------------------------------------------------


async def test_stream_is_decoded_by_aiohttp_into_the_exact_concatenation(make_server):
    pieces = [b"alpha", b"", bytes(range(256)) * 300, b"\r\n0\r\n\r\n", b"omega"]

    async def handler(request: Request) -> None:
        request.start(200, {"Content-Type": "application/octet-stream"}, pieces[0])
        for piece in pieces[1:-1]:
            request.write(piece)
            await request.drain()
        request.end(pieces[-1])

    server = await make_server(handler)
    async with aiohttp.ClientSession() as session:
        for _ in range(2):  # twice, over the kept-alive connection
            async with session.get(f"http://127.0.0.1:{server.port}/s") as resp:
                assert resp.status == 200
                assert resp.headers["Transfer-Encoding"] == "chunked"
                assert "Content-Length" not in resp.headers
                assert await asyncio.wait_for(resp.read(), PATIENCE) == b"".join(pieces)


async def test_stream_framing_on_the_wire(make_server, connect):
    async def handler(request: Request) -> None:
        request.start(200, {"Content-Type": "text/plain"}, b"ab")
        request.write(b"")  # nothing, not a terminating empty chunk
        request.write(bytearray(b"cde"))
        request.end()
        request.write(b"after")  # ignored once ended
        request.end(b"again")

    server = await make_server(handler)
    client = await connect(server)
    await client.send(get("/"))
    reply = await client.reply()
    assert reply.chunks == [b"ab", b"cde"]
    assert reply.header("Content-Length") is None
    await client.send(get("/"))  # the connection is still in step
    assert (await client.reply()).chunks == [b"ab", b"cde"]


async def test_stream_first_data_goes_out_with_the_head(make_server, connect):
    release = asyncio.Event()

    async def handler(request: Request) -> None:
        request.start(200, {"Content-Type": "text/plain"}, b"hello")
        await release.wait()
        request.end(b"bye")

    server = await make_server(handler)
    client = await connect(server)
    await client.send(get("/"))
    head = await asyncio.wait_for(client.reader.readuntil(b"\r\n\r\n"), PATIENCE)
    assert b"Transfer-Encoding: chunked\r\n" in head
    first = await asyncio.wait_for(client.reader.readuntil(b"hello\r\n"), PATIENCE)  # while the handler still waits
    assert first == b"5\r\nhello\r\n"
    release.set()
    assert await asyncio.wait_for(client.reader.readuntil(b"0\r\n\r\n"), PATIENCE) == b"3\r\nbye\r\n0\r\n\r\n"


async def test_http10_stream_is_unframed_and_ends_with_the_connection(make_server, connect):
    async def handler(request: Request) -> None:
        request.start(200, {"Content-Type": "text/plain"}, b"one ")
        request.write(b"two ")
        await request.drain()
        request.end(b"three")

    server = await make_server(handler)
    client = await connect(server)
    await client.send(get("/", b"Connection: keep-alive", version=b"1.0"))  # keep-alive asked for, but no framing
    reply = await client.reply()
    assert reply.status == 200
    assert reply.header("Transfer-Encoding") is None
    assert reply.header("Content-Length") is None
    assert reply.header("Connection") == "close"
    assert reply.body == b"one two three"  # read to the end of the connection


# ---- handler failures -------------------------------------------------------------------------------------------


async def test_handler_exception_is_500_and_closes(make_server, connect):
    async def handler(request: Request) -> None:
        raise RuntimeError("boom")

    server = await make_server(handler)
    client = await connect(server)
    await client.send(get("/"))
    reply = await client.reply()
    assert reply.status == 500
    assert reply.header("Connection") == "close"
    assert reply.json() == json.loads(error_body(500, "Internal router error."))
    assert b"boom" not in reply.body
    assert await client.closed()


async def test_handler_returning_without_an_answer_is_500(make_server, connect):
    async def handler(request: Request) -> None:
        return None

    server = await make_server(handler)
    client = await connect(server)
    await client.send(get("/"))
    reply = await client.reply()
    assert reply.status == 500
    assert reply.json()["error"]["status"] == 500


async def test_stream_left_open_ends_with_the_connection(make_server, connect):
    async def handler(request: Request) -> None:
        request.start(200, {"Content-Type": "text/plain"}, b"partial")

    server = await make_server(handler)
    client = await connect(server)
    await client.send(get("/"))
    head = await asyncio.wait_for(client.reader.readuntil(b"\r\n\r\n"), PATIENCE)
    assert head.startswith(b"HTTP/1.1 200 ") and b"Connection: close" not in head
    rest = await asyncio.wait_for(client.reader.read(), PATIENCE)  # to the end: no terminating chunk
    assert rest == b"7\r\npartial\r\n"


async def test_stream_failing_midway_is_cut_not_terminated(make_server):
    async def handler(request: Request) -> None:
        request.start(200, {"Content-Type": "text/plain"}, b"partial")
        raise RuntimeError("boom")

    server = await make_server(handler)
    async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{server.port}/") as resp:
        assert resp.status == 200
        with pytest.raises(aiohttp.ClientPayloadError):
            await asyncio.wait_for(resp.read(), PATIENCE)


async def test_respond_twice_is_an_error_and_the_first_answer_stands(make_server, connect):
    errors: list[BaseException] = []

    async def handler(request: Request) -> None:
        request.respond(200, b"first", "text/plain")
        for again in (lambda: request.respond(200, b"second"), lambda: request.start(200)):
            try:
                again()
            except RuntimeError as exc:
                errors.append(exc)

    server = await make_server(handler)
    client = await connect(server)
    await client.send(get("/") + get("/"))
    assert (await client.reply()).body == b"first"
    assert (await client.reply()).body == b"first"
    assert len(errors) == 4


# ---- clients that leave -----------------------------------------------------------------------------------------


async def test_write_after_the_client_left_raises_client_gone(make_server, connect):
    outcome: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    async def handler(request: Request) -> None:
        request.start(200, {"Content-Type": "text/plain"}, b"x")
        try:
            async with asyncio.timeout(1.0):
                while True:
                    request.write(b"more")
                    await asyncio.sleep(0.005)
        except ClientGone:
            outcome.set_result("gone")
            raise
        except TimeoutError:
            outcome.set_result("still writing after 1 s")

    server = await make_server(handler)
    client = await connect(server)
    await client.send(get("/"))
    await asyncio.wait_for(client.reader.readuntil(b"\r\n\r\n"), PATIENCE)
    client.close()
    assert await asyncio.wait_for(outcome, 2.0) == "gone"


async def test_respond_after_the_client_left_raises_client_gone(make_server, connect):
    outcome: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    async def handler(request: Request) -> None:
        try:
            await until(lambda: request.client_gone)
            request.respond(200, b"too late")
        except ClientGone:
            outcome.set_result("gone")
            raise
        except BaseException as exc:
            outcome.set_result(repr(exc))
            raise
        outcome.set_result("respond did not raise")

    server = await make_server(handler)
    client = await connect(server)
    await client.send(get("/"))
    client.close()
    assert await asyncio.wait_for(outcome, 2.0) == "gone"


# ---- idle connections -------------------------------------------------------------------------------------------


async def test_idle_connection_is_closed_after_idle_seconds(make_server, connect):
    server = await make_server(echo, idle=0.2)
    client = await connect(server)
    t0 = time.monotonic()
    assert await client.closed(1.0)
    assert time.monotonic() - t0 >= 0.15


async def test_idle_time_counts_from_the_last_response(make_server, connect):
    server = await make_server(echo, idle=1.0)
    client = await connect(server)
    for _ in range(4):  # more than idle_seconds in all, well under it between requests (even on a loaded machine)
        await asyncio.sleep(0.3)
        await client.send(get("/"))
        assert (await client.reply()).status == 200
    t0 = time.monotonic()
    assert await client.closed(PATIENCE)
    assert time.monotonic() - t0 >= 0.5


async def test_a_handler_slower_than_idle_seconds_is_not_cut(make_server, connect):
    async def handler(request: Request) -> None:
        await asyncio.sleep(0.3)
        request.respond(200, b"late but whole", "text/plain")

    server = await make_server(handler, idle=0.1)
    client = await connect(server)
    await client.send(get("/"))
    assert (await client.reply()).body == b"late but whole"


async def test_early_413_connection_is_closed_if_the_body_never_comes(make_server, connect):
    server = await make_server(echo, idle=0.2)
    client = await connect(server)
    await client.send(get("/", b"Content-Length: 5000", method=b"POST"))
    assert (await client.reply()).status == 413
    assert await client.closed(0.6)


# ---- stop -------------------------------------------------------------------------------------------------------


async def test_stop_finishes_the_running_request_and_closes_idle_connections(make_server, connect):
    started = asyncio.Event()
    finished = False

    async def handler(request: Request) -> None:
        nonlocal finished
        if request.method == "HEAD":
            request.respond(200, b"")
            return
        started.set()
        await asyncio.sleep(0.2)
        finished = True
        request.respond(200, b"finished", "text/plain")

    server = await make_server(handler)
    port = server.port
    idle = await connect(server)
    await idle.send(get("/", method=b"HEAD"))  # answered, then kept alive and idle
    await idle.reply(head_only=True)
    busy = await connect(server)
    await busy.send(get("/"))
    await asyncio.wait_for(started.wait(), PATIENCE)
    stopping = asyncio.create_task(server.stop(grace=2.0))
    assert await idle.closed(0.15)
    assert not finished  # the idle one went first
    with pytest.raises(OSError):
        await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 1.0)
    reply = await busy.reply()
    assert (reply.status, reply.body) == (200, b"finished")
    await asyncio.wait_for(stopping, PATIENCE)
    assert await busy.closed()


async def test_stop_cancels_a_handler_that_outlives_the_grace(make_server, connect):
    started = asyncio.Event()
    cancelled = asyncio.Event()

    async def handler(request: Request) -> None:
        started.set()
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    server = await make_server(handler)
    client = await connect(server)
    await client.send(get("/"))
    await asyncio.wait_for(started.wait(), PATIENCE)
    t0 = time.monotonic()
    await asyncio.wait_for(server.stop(grace=0.1), 1.5)
    assert time.monotonic() - t0 < 1.0
    assert cancelled.is_set()
    assert await client.closed()


# ---- flow control -----------------------------------------------------------------------------------------------


async def stalled(progress: Callable[[], int], timeout: float = PATIENCE) -> None:
    """Wait until `progress()` has not moved for 50 ms."""
    last, still = -1, 0
    async with asyncio.timeout(timeout):
        while still < 5:
            await asyncio.sleep(0.01)
            still = still + 1 if progress() == last else 0
            last = progress()


def piece(i: int, size: int) -> bytes:
    return hashlib.sha256(i.to_bytes(4, "big")).digest() * (size // 32)


async def test_drain_waits_for_a_slow_reader_and_the_data_arrives_intact(make_server, connect):
    size, count = 64 << 10, 128  # 8 MB
    sent = 0
    in_drain = False
    done = asyncio.Event()

    async def handler(request: Request) -> None:
        nonlocal sent, in_drain
        request.start(200, {"Content-Type": "application/octet-stream"})
        for i in range(count):
            request.write(piece(i, size))
            sent += size
            in_drain = True
            await request.drain()
            in_drain = False
        request.end()
        done.set()

    server = await make_server(handler)
    client = await connect(server, rcvbuf=64 << 10)
    await client.send(get("/"))
    await stalled(lambda: sent)  # the client reads nothing: the handler's progress stops, parked in drain()
    assert 0 < sent < size * count
    assert in_drain and not done.is_set()
    # once the client reads, it all comes through
    reply = await client.reply(timeout=2.0)
    assert done.is_set()
    assert len(reply.body) == size * count
    expected = hashlib.sha256(b"".join(piece(i, size) for i in range(count))).hexdigest()
    assert hashlib.sha256(reply.body).hexdigest() == expected


async def test_drain_raises_client_gone_when_the_slow_reader_leaves(make_server, connect):
    outcome: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    sent = 0

    async def handler(request: Request) -> None:
        nonlocal sent
        request.start(200, {"Content-Type": "application/octet-stream"})
        try:
            for i in range(256):
                request.write(piece(i, 64 << 10))
                sent += 1
                await request.drain()
        except ClientGone:
            outcome.set_result("gone")
            raise
        outcome.set_result("wrote everything")
        request.end()

    server = await make_server(handler)
    client = await connect(server, rcvbuf=64 << 10)
    await client.send(get("/"))
    await stalled(lambda: sent)
    assert 0 < sent < 256
    client.writer.transport.abort()
    assert await asyncio.wait_for(outcome, 1.0) == "gone"


async def test_a_client_that_never_reads_is_cut_and_all_it_held_is_freed(make_server, connect):
    # A zero window: the client's receive buffer is tiny and it never reads. Without a deadline the handler would wait
    # in drain() for ever, with its in-flight slot and the pipelined request queued behind it.
    rejected = Rejections()
    outcome: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    async def handler(request: Request) -> None:
        if request.path != "/stream":
            request.respond(200, b"")
            return
        request.start(200, {"Content-Type": "application/octet-stream"})
        try:
            for i in range(1024):  # 64 MB: far more than the socket buffers hold
                request.write(piece(i, 64 << 10))
                await request.drain()
        except ClientGone:
            outcome.set_result("gone")
            raise
        outcome.set_result("wrote everything")
        request.end()

    server = await make_server(handler, write_stall_seconds=0.3, on_reject=rejected)
    client = await connect(server, rcvbuf=4096)
    await client.send(get("/stream") + post("/queued", b"q" * 900))
    await until(lambda: server._inflight == 1, PATIENCE)
    [conn] = server._conns
    await until(lambda: len(conn._queue) == 1, PATIENCE)
    assert await asyncio.wait_for(outcome, PATIENCE) == "gone"
    await until(lambda: server._inflight == 0 and not server._conns and not server._tasks, PATIENCE)
    assert not conn._queue  # the queued request and its body are let go
    assert rejected == ["write_timeout"]


async def test_a_whole_answer_nobody_reads_does_not_hold_the_connection(make_server, connect):
    # The handler is done, but its answer sits in the write buffer of a client that never reads: closing would wait
    # for it to go out for ever, and the idle timer never fires while the answer is pending.
    rejected = Rejections()

    async def handler(request: Request) -> None:
        request.respond(200, b"x" * (16 << 20), "application/octet-stream")

    server = await make_server(handler, idle=60.0, write_stall_seconds=0.3, on_reject=rejected)
    client = await connect(server, rcvbuf=4096)
    await client.send(get("/"))
    await until(lambda: server._conns, PATIENCE)
    await until(lambda: not server._conns, PATIENCE)
    assert rejected == ["write_timeout"]


@pytest.mark.parametrize("answer", ["stream", "whole"])
async def test_a_slow_reader_that_keeps_reading_is_not_cut(make_server, connect, answer):
    # The deadline is for a client that reads nothing, not for one slower than the handler: a whole answer of 24 MB
    # stays over the high-water mark for longer than the deadline, but the client reads some of it all the while.
    size = (384 if answer == "whole" else 128) * (64 << 10)

    async def handler(request: Request) -> None:
        if answer == "whole":
            request.respond(200, b"".join(piece(i, 64 << 10) for i in range(384)), "application/octet-stream")
            return
        request.start(200, {"Content-Type": "application/octet-stream"})
        for i in range(128):  # 8 MB
            request.write(piece(i, 64 << 10))
            await request.drain()
        request.end()

    # Reading 64 KiB every 10 ms at most (3 s and more for the whole answer), the client leaves the server's buffers
    # full most of the time; the kernel's send buffer (up to 4 MB) wakes the writer only when half of it is free.
    server = await make_server(handler, write_stall_seconds=2.0)
    client = await connect(server, rcvbuf=64 << 10)
    await client.send(get("/"))
    head = await asyncio.wait_for(client.reader.readuntil(b"\r\n\r\n"), PATIENCE)
    assert b" 200 " in head
    got = 0
    async with asyncio.timeout(PATIENCE * 4):
        while data := await client.reader.read(64 << 10):
            got += len(data)
            if got >= size and (answer == "whole" or data.endswith(b"0\r\n\r\n")):
                break
            await asyncio.sleep(0.01)
    assert got >= size  # all of it, not cut


# ---- what a client can make the server hold: time, connections, requests in flight -----------------------------


class Rejections(list):
    def __call__(self, reason: str) -> None:
        self.append(reason)


async def trickle(client: Client, data: bytes, every: float) -> None:
    """Send `data` a byte at a time, `every` seconds apart, until the server closes the connection."""
    for byte in data:
        try:
            await client.send(bytes([byte]))
        except (ConnectionError, TimeoutError):
            return
        await asyncio.sleep(every)


@pytest.mark.parametrize("part", ["head", "body"])
async def test_a_trickled_request_meets_its_deadline(make_server, connect, part):
    # Bytes keep coming (the idle timer never fires), but the head or the body must be complete within its
    # deadline from its first byte.
    rejected = Rejections()
    handler = Recording()
    server = await make_server(handler, idle=5.0, head_seconds=0.6, body_seconds=0.6, on_reject=rejected)
    client = await connect(server)
    body = b'{"x": "' + b"y" * 60 + b'"}'
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n" % len(body)
    started = time.monotonic()
    if part == "head":
        sender = asyncio.create_task(trickle(client, head, 0.05))
    else:
        await client.send(head)
        sender = asyncio.create_task(trickle(client, body, 0.05))
    reply = await client.reply(timeout=3.0)
    assert reply.status == 408 and reply.header("Connection") == "close"
    assert 0.5 < time.monotonic() - started < 2.0
    assert await client.closed()
    await sender
    assert rejected == [f"{part}_timeout"] and handler.calls == []


async def test_a_slow_but_timely_request_is_served(make_server, connect):
    server = await make_server(echo, head_seconds=2.0, body_seconds=2.0)
    client = await connect(server)
    await trickle(client, get("/slow"), 0.0)
    assert (await client.reply()).status == 200


async def test_one_client_address_cannot_take_every_connection(make_server, connect):
    rejected = Rejections()
    server = await make_server(echo, max_connections=8, max_connections_per_source=2, on_reject=rejected)
    greedy = [await connect(server), await connect(server)]
    third = await connect(server)
    reply = await third.reply()
    assert reply.status == 503 and reply.header("Retry-After") == "1" and await third.closed()
    assert rejected == ["source_connections"]
    other = await connect(server, source="127.0.0.2")  # another client still gets in
    await other.send(get("/a"))
    assert (await other.reply()).status == 200
    greedy[0].close()
    await until(lambda: server.sources.get("127.0.0.1") == 1)
    again = await connect(server)  # a freed slot of that address is usable again
    await again.send(get("/b"))
    assert (await again.reply()).status == 200
    assert rejected == ["source_connections"]


async def test_the_connection_cap_answers_503_and_keeps_serving_the_others(make_server, connect):
    rejected = Rejections()
    server = await make_server(echo, max_connections=2, on_reject=rejected)
    first, second = await connect(server), await connect(server)
    await first.send(get("/a"))
    assert (await first.reply()).status == 200
    third = await connect(server)
    reply = await third.reply()
    assert reply.status == 503 and reply.header("Retry-After") == "1" and reply.header("Connection") == "close"
    assert await third.closed()
    assert rejected == ["connections"]
    await second.send(get("/b"))
    assert (await second.reply()).status == 200
    first.close()
    await until(lambda: len(server._conns) == 1)
    fourth = await connect(server)  # a freed slot is usable again
    await fourth.send(get("/c"))
    assert (await fourth.reply()).status == 200


async def test_the_inflight_cap_answers_503_only_to_counted_requests(make_server, connect):
    rejected = Rejections()
    release = asyncio.Event()

    async def handler(request: Request) -> None:
        if request.path == "/slow":
            await release.wait()
        request.respond(200, b"done")

    server = await make_server(
        handler, max_inflight=1, limited=lambda method, path: path != "/health", on_reject=rejected
    )
    busy, other = await connect(server), await connect(server)
    await busy.send(get("/slow"))
    await until(lambda: server._inflight == 1)
    await other.send(get("/slow"))
    reply = await other.reply()
    assert reply.status == 503 and reply.header("Retry-After") == "1"
    assert reply.header("Connection") != "close"  # the connection stays usable
    await other.send(get("/health"))
    assert (await other.reply()).status == 200  # probes are not counted
    release.set()
    assert (await busy.reply()).body == b"done"
    await other.send(get("/slow"))
    assert (await other.reply()).status == 200
    assert rejected == ["inflight"] and server._inflight == 0


async def test_http11_without_host_is_400_and_http10_needs_none(make_server, connect):
    handler = Recording()
    server = await make_server(handler)
    client = await connect(server)
    await client.send(b"GET /x HTTP/1.1\r\n\r\n")
    reply = await client.reply()
    assert reply.status == 400 and "Host" in reply.json()["error"]["message"]
    assert await client.closed()
    old = await connect(server)
    await old.send(b"GET /y HTTP/1.0\r\n\r\n")
    assert (await old.reply()).status == 200
    assert handler.calls == ["/y"]


async def test_repeated_headers_are_known_to_the_handler(make_server, connect):
    seen = {}

    async def handler(request: Request) -> None:
        seen.update(auth=request.repeated("Authorization"), conv=request.repeated("x-conversation-id"))
        request.respond(200, b"")

    server = await make_server(handler)
    client = await connect(server)
    await client.send(get("/", b"Authorization: a", b"authorization: b", b"X-Conversation-Id: c"))
    assert (await client.reply()).status == 200
    assert seen == {"auth": True, "conv": False}


async def test_a_repeated_host_is_400(make_server, connect):
    # RFC 9112 3.2: more than one Host is a 400, whatever the version.
    handler = Recording()
    server = await make_server(handler)
    for version in (b"1.1", b"1.0"):
        client = await connect(server)
        await client.send(b"GET /x HTTP/%s\r\nHost: a\r\nHost: b\r\n\r\n" % version)
        reply = await client.reply()
        assert reply.status == 400 and "Host" in reply.json()["error"]["message"]
        assert await client.closed()
    assert handler.calls == []


async def test_trailer_fields_never_become_request_headers(make_server, connect):
    # A gateway checks the head; what comes after the body (a chunked trailer) must not add to it or change it.
    seen: dict[str, Any] = {}

    async def handler(request: Request) -> None:
        seen.update(
            headers=dict(request.headers),
            auth_repeated=request.repeated("Authorization"),
            body=request.body,
        )
        request.respond(200, b"")

    server = await make_server(handler)
    client = await connect(server)
    await client.send(
        b"POST /t HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer head\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5\r\nhello\r\n0\r\nAuthorization: Bearer trailer\r\nX-Conversation-Id: smuggled\r\n\r\n"
    )
    assert (await client.reply()).status == 200
    assert seen["body"] == b"hello"
    assert seen["headers"]["authorization"] == "Bearer head" and not seen["auth_repeated"]
    assert "x-conversation-id" not in seen["headers"]
    await client.send(b"POST /t HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nAuthorization: x\r\n\r\n")
    assert (await client.reply()).status == 200
    assert "authorization" not in seen["headers"]


async def test_header_fields_over_the_cap_are_431(make_server, connect):
    handler = Recording()
    server = await make_server(handler)
    at_cap = await connect(server)
    await at_cap.send(get("/at-cap", *[b"X-A: v"] * 99))  # with Host: 100 fields, the default cap
    assert (await at_cap.reply()).status == 200
    over = await connect(server)
    await over.send(get("/over", *[b"X-A: v"] * 100))
    reply = await over.reply()
    assert reply.status == 431 and reply.header("Connection") == "close"
    assert await over.closed()
    assert handler.calls == ["/at-cap"]


async def test_a_flood_of_repeated_headers_is_431_at_once(make_server, connect):
    # 32k repeats of a 5-byte field (160 KB): joined one by one, each repeat copied all before it.
    handler = Recording()
    server = await make_server(handler)
    client = await connect(server)
    client.writer.write(b"GET / HTTP/1.1\r\nHost: t\r\n" + b"a:b\r\n" * 32000 + b"\r\n")  # refused before read
    reply = await client.reply()
    assert reply.status == 431
    assert handler.calls == []


async def test_the_head_limit_counts_raw_bytes_with_their_separators(make_server, connect):
    # Names and values alone stay under the limit; with each line's ": " and CRLF the head is over it.
    handler = Recording()
    server = await make_server(handler)
    client = await connect(server)
    value = b"v" * 719
    lines = [b"X-%05d: %s" % (i, value) for i in range(90)]
    names_and_values = sum(len(line) - 2 for line in lines)
    request = get("/", *lines)
    assert names_and_values < MAX_HEAD_BYTES - 100 < MAX_HEAD_BYTES < len(request)
    await client.send(request)
    reply = await client.reply()
    assert reply.status == 431
    assert await client.closed()
    assert handler.calls == []

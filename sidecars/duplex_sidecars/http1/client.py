"""A small HTTP/1.1 client for the engine legs: keep-alive connections per engine, one write per request, responses
parsed by llhttp (httptools) straight into a byte buffer the relay reads from.

The legs are the router's hot path. A general client (aiohttp's) spends most of a leg in layers the legs never use
(cookies, redirects, tracing, multidicts, per-read futures); this one does only what a POST to an engine needs.
Health probes and the other rare requests keep using aiohttp.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import socket
import ssl
import time
from collections.abc import Awaitable, Callable
from typing import Any, cast
from urllib.parse import urlsplit

import httptools

log = logging.getLogger(__name__)

_HIGH_WATER = 1 << 20  # unread body bytes at which reading from the engine pauses
MAX_HEADER_BYTES = 64 * 1024  # a response head larger than this is not an engine's

Resolver = Callable[[str, int], Awaitable[str]]  # host, port -> the address to connect to


class EngineConnectError(ConnectionError):
    """No connection to the engine (refused, unreachable, name not resolved, connect timed out)."""


class EngineDisconnected(ConnectionError):
    """The engine closed the connection or answered something that is not HTTP."""


class _Origin:
    """scheme://host:port, parsed once per engine URL."""

    __slots__ = ("host", "host_header", "key", "port", "prefix", "ssl")

    def __init__(self, base: str):
        parts = urlsplit(base)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {base!r}")
        self.ssl = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port or (443 if self.ssl else 80)
        self.key = base
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.host_header = host if parts.port is None else f"{host}:{self.port}"
        self.prefix = parts.path.rstrip("/")  # an engine behind a path (a gateway) keeps it


class EngineResponse:
    """One response: status and headers once they have arrived, then the body as it comes. Read it with `read_any`
    or `read`; `release` (after the end) or `close` (any time) when done."""

    __slots__ = (
        "_chunks",
        "_conn",
        "_eof",
        "_eof_callbacks",
        "_exc",
        "_paused",
        "_size",
        "_waiter",
        "closed",
        "headers",
        "resent",
        "status",
    )

    def __init__(self, conn: _Connection, status: int, headers: list[tuple[bytes, bytes]]):
        self.resent = False  # the request went out a second time, after a stale keep-alive connection
        self.status = status
        self.headers = headers
        self._conn: _Connection | None = conn
        self._chunks: collections.deque[bytes] = collections.deque()
        self._size = 0
        self._eof = False
        self._exc: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._eof_callbacks: list[Callable[[], Any]] = []
        self._paused = False
        self.closed = False  # `close` was called before the body ended

    def header(self, name: bytes) -> bytes | None:
        for key, value in self.headers:
            if key == name:
                return value
        return None

    # ---- fed by the connection -----------------------------------------------------------------------------------

    def _arrived(self) -> None:
        """Body bytes were appended to `_chunks` (by the connection, one append per HTTP chunk): wake the reader."""
        if self._size > _HIGH_WATER and not self._paused and self._conn is not None:
            self._paused = True
            self._conn.pause()
        self._wake()

    def _end(self) -> None:
        self._eof = True
        self._conn = None
        self._wake()
        callbacks, self._eof_callbacks = self._eof_callbacks, []
        for callback in callbacks:
            try:
                callback()
            except Exception:  # one failing callback must not keep the others (or the connection) from their end
                log.exception("end-of-body callback failed")

    def set_exception(self, exc: BaseException) -> None:
        """Fail the current and every later read (unless the body has already ended)."""
        if self._eof:
            return
        self._exc = exc
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    # ---- read by the relay ---------------------------------------------------------------------------------------

    async def read_any(self) -> bytes:
        """Everything that has arrived since the last read, in one piece; waits when nothing has; b"" at the end."""
        while not self._chunks:
            if self._exc is not None:
                raise self._exc
            if self._eof:
                return b""
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        data = self._chunks.popleft() if len(self._chunks) == 1 else b"".join(self._chunks)
        self._chunks.clear()
        self._size = 0
        if self._paused and self._conn is not None:
            self._paused = False
            self._conn.resume()
        return data

    async def read(self) -> bytes:
        """The whole body."""
        parts = []
        while data := await self.read_any():
            parts.append(data)
        return b"".join(parts)

    def is_eof(self) -> bool:
        return self._eof

    def exception(self) -> BaseException | None:
        return self._exc

    def on_eof(self, callback: Callable[[], Any]) -> None:
        """Call `callback` when the body ends (now, if it has)."""
        if self._eof:
            callback()
        else:
            self._eof_callbacks.append(callback)

    def release(self) -> None:
        """Done with a response whose body has ended: its connection is already back in the pool."""
        if not self._eof:
            self.close()

    def close(self) -> None:
        """Done with the response: a body still arriving is cut off by closing its connection (which makes the
        engine abort the request)."""
        conn, self._conn = self._conn, None
        if not self._eof:
            self.closed = True
            self._chunks.clear()  # nothing more is read from a closed response
            self._size = 0
        if conn is not None and not self._eof:
            conn.abort()
            self.set_exception(EngineDisconnected("response closed"))


class _Connection(asyncio.Protocol):
    """One keep-alive connection to an engine, one request at a time."""

    def __init__(self, client: EngineClient, origin: _Origin):
        self._client = client
        self.origin = origin
        self.transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self._headers: list[tuple[bytes, bytes]] = []
        self._header_bytes = 0
        self._framed = False  # the response has a length or is chunked (else it ends when the connection does)
        self._head: asyncio.Future[EngineResponse] | None = None
        self._response: EngineResponse | None = None
        self._fed: EngineResponse | None = None  # got body bytes during the current read
        self.received = False  # any byte of the current exchange
        self.idle_since = 0.0
        self.closed = False

    # ---- asyncio.Protocol ----------------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # what create_connection gives a stream protocol
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        if self._head is None and self._response is None:  # nothing asked: an idle connection must stay silent
            self.abort()
            return
        self.received = True
        try:
            self._parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:  # garbage, or a 101 nobody asked for
            self._fail(EngineDisconnected(f"malformed HTTP response: {exc}"))
            self.abort()
        fed, self._fed = self._fed, None
        if fed is not None:
            fed._arrived()  # once per read from the socket, however many chunks it held

    def eof_received(self) -> bool:
        return False  # close the transport; connection_lost ends the exchange

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._client._forget(self)
        response = self._response
        if response is not None and not self._framed and self._head is None and exc is None:
            self._response = None
            response._end()  # a body without a length ends with the connection
            return
        self._fail(EngineDisconnected(f"connection lost: {exc}" if exc else "the engine closed the connection"))

    # ---- httptools callbacks -------------------------------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_bytes += len(name) + len(value) + 4
        if self._header_bytes > MAX_HEADER_BYTES:
            if not self.closed:
                self._fail(EngineDisconnected(f"response headers exceed {MAX_HEADER_BYTES} bytes"))
                self.abort()
            return
        self._headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        self._header_bytes = 0
        if 100 <= status < 200:  # an interim answer: the real one follows
            self._headers = []
            return
        headers, self._headers = self._headers, []
        if self._head is None:  # an answer nobody asked for
            self.abort()
            return
        self._framed = any(k in (b"content-length", b"transfer-encoding") for k, _ in headers)
        self._response = EngineResponse(self, status, headers)
        head, self._head = self._head, None
        if head is not None and not head.done():
            head.set_result(self._response)

    def on_body(self, body: bytes) -> None:
        response = self._response
        if response is not None:
            response._chunks.append(body)
            response._size += len(body)
            self._fed = response

    def on_message_complete(self) -> None:
        response, self._response = self._response, None
        if response is None:  # the end of an interim answer
            return
        keep = self._parser.should_keep_alive() and self._framed
        response._end()
        if keep:
            self._client._put_back(self)
        else:
            self.abort()

    # ---- used by the client --------------------------------------------------------------------------------------

    def send(self, data: bytes) -> asyncio.Future[EngineResponse]:
        self._head = asyncio.get_running_loop().create_future()
        self.received = False
        assert self.transport is not None
        self.transport.write(data)
        return self._head

    def _fail(self, exc: BaseException) -> None:
        head, self._head = self._head, None
        if head is not None and not head.done():
            head.set_exception(exc)
        response, self._response = self._response, None
        if response is not None:
            response.set_exception(exc)

    def pause(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.pause_reading()

    def resume(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.resume_reading()

    def abort(self) -> None:
        if not self.closed:
            self.closed = True
            self._client._forget(self)
            if self.transport is not None:
                self.transport.abort()
            self._fail(EngineDisconnected("connection closed by the router"))


class EngineClient:
    """Keep-alive connections per engine origin. `resolver` maps an engine's host to the address to dial (tests use
    it to reach pod addresses on loopback); idle connections older than `idle_seconds` are not reused."""

    def __init__(self, resolver: Resolver | None = None, idle_seconds: float = 60.0):
        self._resolver = resolver
        self._idle_seconds = idle_seconds
        self._origins: dict[str, _Origin] = {}
        self._idle: dict[str, list[_Connection]] = {}
        self._busy: set[_Connection] = set()
        self._ssl: ssl.SSLContext | None = None
        self._closed = False

    async def post(
        self,
        base: str,
        path: str,
        body: bytes,
        headers: dict[str, str],
        connect_timeout: float,
        *,
        resend_stale: bool = True,
        max_idle: float | None = None,
    ) -> EngineResponse:
        """POST `body` to base + path; returns once the response's status and headers are in. Raises
        EngineConnectError when no connection could be made, EngineDisconnected when the exchange broke off.

        A pooled keep-alive connection may turn out closed by the engine (its keep-alive timeout) just as the request
        goes out, before any answer: with `resend_stale` the request goes out once more on a fresh connection and the
        response says so (`resent`); without, that is an EngineDisconnected like any other. `max_idle` limits which
        pooled connections are used at all (seconds idle), for requests that must not meet a stale one."""
        origin = self._origins.get(base)
        if origin is None:
            origin = self._origins[base] = _Origin(base)
        head = _request_head(origin, path, len(body), headers)
        message = head + body if len(body) < 65536 else None
        conn = self._take_idle(origin, max_idle)
        resent = False
        if conn is not None:
            try:
                return await self._exchange(conn, message, head, body)
            except EngineDisconnected as exc:
                if conn.received or not resend_stale:
                    raise EngineDisconnected(f"{exc} (on a pooled keep-alive connection)") from exc
                resent = True
        conn = await self._connect(origin, connect_timeout)
        resp = await self._exchange(conn, message, head, body)
        resp.resent = resent
        return resp

    async def _exchange(self, conn: _Connection, message: bytes | None, head: bytes, body: bytes) -> EngineResponse:
        self._busy.add(conn)
        if message is not None:
            answer = conn.send(message)
        else:
            answer = conn.send(head)
            assert conn.transport is not None
            conn.transport.write(body)
        try:
            return await answer
        except BaseException:
            conn.abort()  # cancelled or failed with the request in flight: the connection's state is unknown
            raise

    def _take_idle(self, origin: _Origin, max_idle: float | None = None) -> _Connection | None:
        """The most recently used idle connection; none when even that one has been idle for over `max_idle`
        (the others stay pooled for requests that accept them)."""
        idle = self._idle.get(origin.key)
        now = time.monotonic()
        while idle:
            if max_idle is not None and now - idle[-1].idle_since > max_idle:
                return None
            conn = idle.pop()
            if conn.closed or conn.transport is None or conn.transport.is_closing():
                continue
            if now - conn.idle_since > self._idle_seconds:
                conn.abort()
                continue
            return conn
        return None

    async def _connect(self, origin: _Origin, timeout: float) -> _Connection:
        if self._closed:
            raise EngineConnectError("the client is closed")
        loop = asyncio.get_running_loop()
        host = origin.host
        try:
            async with asyncio.timeout(timeout):
                if self._resolver is not None:
                    host = await self._resolver(origin.host, origin.port)
                context = self._ssl_context() if origin.ssl else None
                _, conn = await loop.create_connection(
                    lambda: _Connection(self, origin),
                    host,
                    origin.port,
                    ssl=context,
                    server_hostname=origin.host if context else None,
                )
        except TimeoutError as exc:
            raise EngineConnectError("connect timed out") from exc
        except (OSError, ValueError, LookupError) as exc:  # also what a resolver may raise for an unknown name
            raise EngineConnectError(f"cannot connect to {origin.key}: {exc}") from exc
        if self._closed:  # closed while this connection was being made
            conn.abort()
            raise EngineConnectError("the client is closed")
        return conn

    def _ssl_context(self) -> ssl.SSLContext:
        if self._ssl is None:
            self._ssl = ssl.create_default_context()
        return self._ssl

    def _put_back(self, conn: _Connection) -> None:
        self._busy.discard(conn)
        if self._closed or conn.closed:
            conn.abort()
            return
        conn.idle_since = time.monotonic()
        self._idle.setdefault(conn.origin.key, []).append(conn)

    def _forget(self, conn: _Connection) -> None:
        self._busy.discard(conn)
        idle = self._idle.get(conn.origin.key)
        if idle and conn in idle:
            idle.remove(conn)

    def connections(self) -> tuple[int, int]:
        """(idle, busy) connection counts."""
        return sum(len(v) for v in self._idle.values()), len(self._busy)

    async def close(self) -> None:
        self._closed = True
        for conn in [c for idle in self._idle.values() for c in idle] + list(self._busy):
            conn.abort()
        self._idle.clear()
        self._busy.clear()
        await asyncio.sleep(0)  # let the transports finish closing


def _request_head(origin: _Origin, path: str, length: int, headers: dict[str, str]) -> bytes:
    target = origin.prefix + path
    if not target.startswith("/") or any(c in target for c in " \r\n"):
        raise ValueError(f"not a request path: {target!r}")
    lines = [f"POST {target} HTTP/1.1", f"Host: {origin.host_header}", f"Content-Length: {length}"]
    for name, value in headers.items():
        if "\r" in value or "\n" in value or "\r" in name or "\n" in name or ":" in name:
            raise ValueError(f"header {name!r} has characters HTTP does not allow")
        lines.append(f"{name}: {value}")
    lines.append("\r\n")
    return "\r\n".join(lines).encode("latin-1")

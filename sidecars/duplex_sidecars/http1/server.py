"""The router's client-facing HTTP/1.1 server: requests parsed by llhttp (httptools), bodies collected against the
configured limit, one handler at a time per connection, responses written straight to the transport.

A general server (aiohttp's) builds request and response objects, multidicts, routing and middleware state on every
request; at the router's request rates that was about a sixth of its CPU. This one does only what the router's routes
need: a method, a path, a few headers, a body, and a response that is either whole or a chunked stream.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import socket
import time
from collections.abc import Awaitable, Callable, Collection, Coroutine, Mapping
from email.utils import formatdate
from http import HTTPStatus
from typing import Any, cast

import httptools

log = logging.getLogger(__name__)

MAX_HEAD_BYTES = 64 * 1024  # request line and header lines, as on the wire
# What a head counts before its header lines: the request line around its URL (at least "GET " and " HTTP/1.1\r\n")
# and the blank line that ends the head.
_HEAD_FRAMING = 17
MAX_QUEUED = 8  # pipelined requests parsed ahead of the one being handled before reading pauses
_DISCARD_LIMIT = 1 << 20  # body bytes read and dropped after an early answer before the connection is cut
BODIES_HELD = "Request bodies held by the server are at their limit; retry shortly."

Handler = Callable[["Request"], Awaitable[None]]
# (method, path, headers) of a complete head -> None to go on, or the (status, JSON body) to answer instead
Admit = Callable[[str, str, Mapping[str, str]], "tuple[int, bytes] | None"]


class ClientGone(ConnectionError):
    """The client's connection closed before the response was written."""


_REASONS = {s.value: s.phrase.encode() for s in HTTPStatus}
_date_cache: list[tuple[int, bytes]] = [(0, b"")]  # the second and its Date header value


def _status_head(status: int) -> bytes:
    """A response's status line and the headers every response carries."""
    return b"HTTP/1.1 %d %s\r\nDate: %s\r\nServer: duplex-router\r\n" % (
        status,
        _REASONS.get(status, b"Unknown"),
        _date(),
    )


def _date() -> bytes:
    now = int(time.time())
    second, value = _date_cache[0]
    if now != second:
        value = formatdate(now, usegmt=True).encode()
        _date_cache[0] = (now, value)
    return value


class Request:
    """One request: method, path (query removed), headers (lower-case names), body; and its response, written with
    `respond` (whole) or `start` + `write` + `end` (chunked)."""

    __slots__ = (
        "_conn",
        "_head_only",
        "_repeated",
        "body",
        "finished",
        "headers",
        "held",
        "http11",
        "keep_alive",
        "method",
        "path",
        "query",
        "refusal",
        "started",
        "status",
    )

    def __init__(
        self,
        conn: _Connection,
        method: str,
        url: bytes,
        headers: dict[str, str],
        http11: bool,
        repeated: Collection[str] | None = None,
    ):
        self._conn = conn
        self._repeated = repeated
        self.method = method
        path, _, query = url.partition(b"?")
        self.path = path.decode("latin-1")
        self.query = query.decode("latin-1")
        self.headers = headers
        self.body = b""
        self.http11 = http11
        self.keep_alive = True
        self.started = False  # the response head is out
        self.finished = False  # the whole response is out
        self.status = 0
        self.held = 0  # bytes its body holds of the server's limits.max_held_bodies, until its handler ends
        self.refusal: bytes | None = None  # the body of limits.admit's answer, when it refused the head
        self._head_only = method == "HEAD"

    def header(self, name: str) -> str | None:
        """A request header by case-insensitive name (repeated headers joined with ", ")."""
        return self.headers.get(name.lower())

    def repeated(self, name: str) -> bool:
        """Whether the header came more than once."""
        return self._repeated is not None and name.lower() in self._repeated

    @property
    def client_gone(self) -> bool:
        return self._conn.closed

    # ---- responses -----------------------------------------------------------------------------------------------

    def _head(self, status: int, headers: dict[str, str] | None, framing: bytes) -> bytearray:
        out = bytearray(_status_head(status))
        if headers:
            for name, value in headers.items():
                if "\r" in value or "\n" in value or "\r" in name or "\n" in name or ":" in name:
                    raise ValueError(f"header {name!r} is not a valid header")
                out += b"%s: %s\r\n" % (name.encode("latin-1"), value.encode("latin-1"))
        self.status = status
        self.started = True
        out += framing
        if not self.keep_alive:
            out += b"Connection: close\r\n"
        out += b"\r\n"
        return out

    def respond(
        self, status: int, body: bytes, content_type: str = "application/json", headers: dict[str, str] | None = None
    ) -> None:
        """The whole response in one write. ClientGone if the client has left."""
        if self.started:
            raise RuntimeError("response already started")
        all_headers = {"Content-Type": content_type}
        if headers:
            all_headers.update(headers)
        out = self._head(status, all_headers, b"Content-Length: %d\r\n" % len(body))
        if not self._head_only:
            out += body
        self.finished = True
        self._conn.send(out)

    def start(self, status: int, headers: dict[str, str] | None = None, first: bytes | bytearray = b"") -> None:
        """Start a streamed (chunked) response, with its first data in the same write."""
        if self.started:
            raise RuntimeError("response already started")
        if not self.http11:
            self.keep_alive = False  # HTTP/1.0 has no chunked encoding: the body ends when the connection does
            out = self._head(status, headers, b"")
        else:
            out = self._head(status, headers, b"Transfer-Encoding: chunked\r\n")
        if self._head_only:
            self.finished = True
            self._conn.send(out)
            return
        if first:
            out += self._chunk(first)
        self._conn.send(out)

    def _chunk(self, data: bytes | bytearray) -> bytes | bytearray:
        if not self.http11:
            return data
        return b"%x\r\n%s\r\n" % (len(data), data)

    def write(self, data: bytes | bytearray) -> None:
        """More of a streamed response (nothing for empty data). ClientGone if the client has left."""
        if self.finished or not data:
            if self._conn.closed:
                raise ClientGone()
            return
        self._conn.send(self._chunk(data))

    def end(self, data: bytes | bytearray = b"") -> None:
        """The last of a streamed response, with its terminating chunk in the same write."""
        if self.finished:
            return
        self.finished = True
        out = self._chunk(data) if data else b""
        if self.http11:
            out += b"0\r\n\r\n"
        self._conn.send(out)

    async def drain(self) -> None:
        """Wait while the client is slower than the response (a no-op unless its buffer is over the high water)."""
        await self._conn.drain()


class Limits:
    """What the server enforces, so that no client can make it hold more than this: `max_body` (read per request: it
    can change on reload), an idle timeout per connection, deadlines for a request's head and for its body (from their
    first byte, however slowly the rest trickles in), a cap on a head's header fields, caps on open connections (in all
    and from one client address: a gateway's pods or the kubelet's probes keep room beside a client that opens as
    many as it can) and on requests in handlers (only those `limited` says count; probes and metrics stay answerable), and a deadline for
    a client that stops reading: a connection whose write buffer stays over its high-water mark for
    `write_stall_seconds` without the client reading any of it is cut, and its handler's next write or drain raises
    ClientGone. `max_held_bodies` bounds the request bodies held at once across every connection (being read, queued
    behind another request or with their handler), reserved from the Content-Length when a head is complete (a chunked
    body as it arrives): one more is answered 503 with Retry-After. `admit` sees each request's head as soon as it is
    complete, before its body is reserved or read: a (status, body) it returns is the answer (the body is read and
    dropped, then the connection closes), so that a request the application would refuse anyway (no valid key) holds
    nothing. Each refusal is reported to `on_reject` with its reason: connections, source_connections, inflight, bodies,
    head_timeout, body_timeout, write_timeout (`admit` counts its own)."""

    def __init__(
        self,
        max_body: Callable[[], int],
        idle_seconds: float = 75.0,
        *,
        head_seconds: float = 10.0,
        body_seconds: float = 60.0,
        max_connections: int = 4096,
        max_connections_per_source: int = 4096,
        max_inflight: int = 512,
        max_header_fields: int = 100,
        write_stall_seconds: float = 60.0,
        max_held_bodies: int = 256 * 1024 * 1024,
        admit: Admit = lambda method, path, headers: None,
        limited: Callable[[str, str], bool] = lambda method, path: True,
        on_reject: Callable[[str], None] = lambda reason: None,
    ):
        self.max_body = max_body
        self.idle_seconds = idle_seconds
        self.head_seconds = head_seconds
        self.body_seconds = body_seconds
        self.max_connections = max_connections
        self.max_connections_per_source = max_connections_per_source
        self.max_inflight = max_inflight
        self.max_header_fields = max_header_fields
        self.write_stall_seconds = write_stall_seconds
        self.max_held_bodies = max_held_bodies
        self.admit = admit
        self.limited = limited
        self.on_reject = on_reject


class _Connection(asyncio.Protocol):
    def __init__(self, server: FrontServer):
        self._server = server
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._parser = httptools.HttpRequestParser(self)
        self._url = b""
        self._headers: dict[str, str] = {}
        # Headers that came more than once: every value, in order, joined once the head is in (joining as each repeat
        # came would copy all the values before it every time).
        self._repeated: dict[str, list[str]] | None = None
        self._in_head = False  # between the start of a request and the end of its head
        self._began = False  # ... and the request began in the data being fed now
        self._head_bytes = 0
        self._fields_left = 0  # header fields the request may still have (its trailer's count too)
        self._body: list[bytes] = []
        self._body_size = 0
        self._too_large = False
        self._held = 0  # bytes of the body being read reserved against limits.max_held_bodies
        self._declared = False  # the body being read came with a Content-Length (reserved whole at its head)
        self._over_budget = False  # ... and found no room among the bodies held
        self._refusal: tuple[int, bytes] | None = None  # what `admit` answered for the request being read
        self._queue: collections.deque[Request] = collections.deque()
        self._busy = False  # a handler is running
        self._last = False  # nothing after the queued requests is read (Connection: close, upgrade, garbage)
        self._continue = False  # a 100 Continue is owed once the requests before it are answered
        self._discard = 0  # >0: an early answer went out; the rest of this body is read and dropped
        self._paused_write = False
        self._stall: asyncio.TimerHandle | None = None  # cuts a client that leaves the write buffer full
        self._unsent = 0  # the write buffer's size when `_stall` was set
        self._drain: asyncio.Future[None] | None = None
        self._paused_read = False
        self._idle: asyncio.TimerHandle | None = None
        self._active = 0.0  # loop time of the last data from the client
        self._deadline: asyncio.TimerHandle | None = None  # for the head or the body being read
        self._source: str | None = None  # the client's address, once the connection is counted against it

    # ---- transport events ----------------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        stream = self.transport = cast(asyncio.Transport, transport)  # what create_server gives a stream protocol
        limits = self._server.limits
        peer = stream.get_extra_info("peername")
        source = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        refusal = None
        if len(self._server._conns) >= limits.max_connections:
            refusal = "connections"
        elif self._server.sources[source] >= limits.max_connections_per_source:
            refusal = "source_connections"
        if refusal is not None:
            limits.on_reject(refusal)
            self._last = True
            self.closed = True
            stream.write(self._server.error_bytes(503, "Too many open connections.", retry_after=True))
            stream.close()
            return
        self._source = source
        self._server.sources[source] += 1
        sock = stream.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        self._server._conns.add(self)
        loop = asyncio.get_running_loop()
        self._active = loop.time()
        self._idle = loop.call_later(self._server.limits.idle_seconds, self._idle_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._server._conns.discard(self)
        if self._source is not None:
            self._server.release_source(self._source)
            self._source = None
        self._clear_deadline()
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        self._clear_stall()
        for request in self._queue:  # requests never to be answered, and their bodies
            self._server.release(request)
        self._queue.clear()
        self._body = []
        self._server.held_bodies -= self._held
        self._held = 0
        self._wake_drain(ClientGone())

    def data_received(self, data: bytes) -> None:
        if self.closed or self._last:
            return
        self._active = self._server.loop_time()
        self._began = False
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            # The request itself is complete and queued: it is answered as HTTP/1.1 (RFC 9110 lets a server ignore
            # Upgrade), and nothing after it is read.
            self._stop_after_queue(400, "Protocol upgrades are not supported.")
            return
        except httptools.HttpParserCallbackError as exc:  # raised in one of the callbacks below
            if isinstance(exc.__context__, _HeadTooLarge):
                self._stop_after_queue(431, str(exc.__context__))
            else:
                log.error("dropping a client connection after an internal error", exc_info=exc.__context__)
                self.abort()
            return
        except httptools.HttpParserError as exc:
            if self._discard:
                self.abort()
            else:
                self._stop_after_queue(400, f"Malformed HTTP request: {exc}.")
            return
        if self._in_head and not self._began:
            # A head that is still incomplete after all of this data: counted here as well, since llhttp reports a
            # header only once its line has ended.
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEAD_BYTES:
                self._stop_after_queue(431, f"Request head larger than {MAX_HEAD_BYTES} bytes.")

    def pause_writing(self) -> None:
        self._paused_write = True
        if self._stall is None:
            self._watch_stall()

    def resume_writing(self) -> None:
        self._paused_write = False
        self._clear_stall()
        self._wake_drain(None)

    def eof_received(self) -> bool:
        return False  # the transport closes; a running handler finds out on its next write

    # ---- llhttp callbacks ----------------------------------------------------------------------------------------

    def on_message_begin(self) -> None:
        limits = self._server.limits
        self._set_deadline(limits.head_seconds, "head")
        self._url = b""
        self._headers = {}
        self._repeated = None
        self._in_head = True
        self._began = True
        self._head_bytes = _HEAD_FRAMING
        self._fields_left = limits.max_header_fields
        self._body = []
        self._body_size = 0
        self._too_large = False
        self._declared = False
        self._over_budget = False
        self._refusal = None

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._count(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        # The line as on the wire: name, ": ", value, CRLF (whitespace llhttp drops before a value is not seen).
        self._head_bytes += len(name) + len(value) + 4
        self._fields_left -= 1
        if self._head_bytes > MAX_HEAD_BYTES or self._fields_left < 0:
            self._head_too_large()
        if not self._in_head:
            return  # a chunked body's trailer: it comes after the head a gateway may have checked, so it is dropped
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        if key in self._headers:
            self._repeat(key, text)
        else:
            self._headers[key] = text

    def _repeat(self, key: str, text: str) -> None:
        if self._repeated is None:
            self._repeated = {}
        values = self._repeated.get(key)
        if values is None:
            self._repeated[key] = [self._headers[key], text]
        else:
            values.append(text)

    def _head_too_large(self) -> None:
        if self._fields_left < 0:
            raise _HeadTooLarge(f"Request head has more than {self._server.limits.max_header_fields} header fields.")
        raise _HeadTooLarge(f"Request head larger than {MAX_HEAD_BYTES} bytes.")

    def _count(self, n: int) -> None:
        self._head_bytes += n
        if self._head_bytes > MAX_HEAD_BYTES:
            raise _HeadTooLarge(f"Request head larger than {MAX_HEAD_BYTES} bytes.")

    def on_headers_complete(self) -> None:
        self._in_head = False
        if self._repeated is not None:
            for key, values in self._repeated.items():
                self._headers[key] = ", ".join(values)
        self._set_deadline(self._server.limits.body_seconds, "body")
        if self._discard:
            return
        length = self._headers.get("content-length")
        self._declared = length is not None
        limit = self._server.limits.max_body()
        self._refusal = self._server.limits.admit(
            self._parser.get_method().decode("latin-1"), self._url.partition(b"?")[0].decode("latin-1"), self._headers
        )
        if self._refusal is not None:
            self._refuse_early(*self._refusal)
        elif length is not None and length.isdigit() and int(length) > limit:
            self._too_large = True
            self._answer_early(413, f"Request body of {length} bytes exceeds the limit of {limit} bytes.")
        elif length is not None and length.isdigit() and not self._reserve(int(length)):
            self._over_budget = True
            self._answer_early(503, BODIES_HELD, retry_after=True)
        elif self._headers.get("expect", "").lower() == "100-continue" and self._parser.get_http_version() == "1.1":
            if self._busy or self._queue:
                self._continue = True  # written when the answers before it are out, never in the middle of one
            else:
                assert self.transport is not None  # parser callbacks come after connection_made
                self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        if self._discard:
            self._discard += len(body)
            if self._discard > _DISCARD_LIMIT:
                self.abort()
            return
        if self._too_large or self._over_budget or self._refusal is not None:
            return
        if not self._declared and not self._reserve(len(body)):  # chunked: reserved as it comes
            self._over_budget = True
            self._body = []
            self._answer_early(503, BODIES_HELD, retry_after=True)
            return
        self._body.append(body)
        self._body_size += len(body)
        limit = self._server.limits.max_body()
        if self._body_size > limit:
            self._too_large = True
            self._body = []
            self._answer_early(413, f"Request body exceeds the limit of {limit} bytes.")

    def on_message_complete(self) -> None:
        self._in_head = False
        self._clear_deadline()
        if self._discard:
            self.close()  # the early answer said Connection: close; the client has sent its body
            return
        parser = self._parser
        request = Request(
            self,
            parser.get_method().decode("latin-1"),
            self._url,
            self._headers,
            parser.get_http_version() == "1.1",
            self._repeated,
        )
        request.keep_alive = parser.should_keep_alive()
        request.held, self._held = self._held, 0
        if self._refusal is not None:
            request.status, request.refusal = self._refusal[0], self._refusal[1]
        elif self._too_large or self._over_budget:
            request.status = 413 if self._too_large else 503
            self._server.release(request)  # its body is dropped
        elif (request.http11 and "host" not in self._headers) or (self._repeated and "host" in self._repeated):
            request.status = 400  # RFC 9112 3.2: an HTTP/1.1 request without Host, or any with more than one
        else:
            body = self._body
            request.body = body[0] if len(body) == 1 else b"".join(body)
        self._body = []
        self._queue.append(request)
        if len(self._queue) >= MAX_QUEUED and not self._paused_read:
            self._paused_read = True
            assert self.transport is not None
            self.transport.pause_reading()
        if not self._busy:
            self._busy = True
            self._server._spawn(self._serve())

    # ---- requests ------------------------------------------------------------------------------------------------

    async def _serve(self) -> None:
        try:
            while self._queue and not self.closed:
                request = self._queue.popleft()
                if self._paused_read and len(self._queue) < MAX_QUEUED // 2 and not self._last:
                    self._paused_read = False
                    assert self.transport is not None  # it was paused, so it is there
                    self.transport.resume_reading()
                try:
                    await self._server._handle(request)
                finally:
                    self._server.release(request)
                if not request.keep_alive:
                    self.close()
                    return
            if self._last:
                self.close()
            elif self._continue and not self.closed:
                self._continue = False
                assert self.transport is not None
                self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        finally:
            self._busy = False

    def _stop_after_queue(self, status: int, message: str) -> None:
        """Stop reading: the requests already queued are answered, then the connection closes. With none queued,
        the client gets `status` first."""
        self._last = True
        if self._busy or self._queue:
            if not self._paused_read and self.transport is not None:
                self._paused_read = True
                self.transport.pause_reading()
            return
        if self.transport is not None and not self.closed:
            self.transport.write(self._server.error_bytes(status, message))
        self.close()

    def _reserve(self, n: int) -> bool:
        """Reserve `n` more bytes for the body being read, if the bodies held leave room for them."""
        server = self._server
        if server.held_bodies + n > server.limits.max_held_bodies:
            server.limits.on_reject("bodies")
            return False
        server.held_bodies += n
        self._held += n
        return True

    def _refuse_early(self, status: int, body: bytes) -> None:
        """`admit`'s answer, written like `_answer_early`'s (in turn when answers before it are still going out)."""
        if self._busy or self._queue:
            return
        self._discard = 1
        self._body = []
        assert self.transport is not None  # parser callbacks come after connection_made
        self.transport.write(self._server.response_bytes(status, body))

    def _answer_early(self, status: int, message: str, retry_after: bool = False) -> None:
        """Answer before the body is in (it is too large), then read and drop the rest of it, then close: closing
        with unread bytes would reset the connection before the client reads the answer."""
        if self._busy or self._queue:  # answered in turn, at the end of the body, which is dropped meanwhile
            return
        self._discard = 1
        self._body = []
        self._server.held_bodies -= self._held  # the rest of the body is dropped as it comes
        self._held = 0
        assert self.transport is not None  # parser callbacks come after connection_made
        self.transport.write(self._server.error_bytes(status, message, retry_after))

    def send(self, data: bytes | bytearray) -> None:
        if self.closed or self.transport is None or self.transport.is_closing():
            self.closed = True
            raise ClientGone()
        self.transport.write(data)

    async def drain(self) -> None:
        if self.closed:
            raise ClientGone()
        if not self._paused_write:
            return
        if self._drain is None:
            self._drain = asyncio.get_running_loop().create_future()
        await self._drain

    def _watch_stall(self) -> None:
        assert self.transport is not None  # writes come after connection_made
        self._unsent = self.transport.get_write_buffer_size()
        self._stall = asyncio.get_running_loop().call_later(
            self._server.limits.write_stall_seconds, self._write_stalled
        )

    def _write_stalled(self) -> None:
        """The write buffer has stayed over its high-water mark for `write_stall_seconds`. A client that read some of
        it meanwhile gets another period; one that read nothing is cut, so that its handler, the handler's in-flight
        slot and whatever it holds (in the router, a decode connection) are let go."""
        self._stall = None
        if self.transport is not None and self.transport.get_write_buffer_size() < self._unsent:
            self._watch_stall()
            return
        self._server.limits.on_reject("write_timeout")
        self.abort()
        self._wake_drain(ClientGone())

    def _clear_stall(self) -> None:
        if self._stall is not None:
            self._stall.cancel()
            self._stall = None

    def _wake_drain(self, exc: BaseException | None) -> None:
        waiter, self._drain = self._drain, None
        if waiter is not None and not waiter.done():
            if exc is None:
                waiter.set_result(None)
            else:
                waiter.set_exception(exc)

    def _set_deadline(self, seconds: float, part: str) -> None:
        self._clear_deadline()
        self._deadline = asyncio.get_running_loop().call_later(seconds, self._late, part, seconds)

    def _clear_deadline(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _late(self, part: str, seconds: float) -> None:
        """The request's head or body did not arrive in time: 408, and the connection closes (what is queued before
        it is answered first)."""
        self._deadline = None
        if self.closed:
            return
        self._server.limits.on_reject(f"{part}_timeout")
        if self._discard:
            self.abort()
            return
        self._stop_after_queue(408, f"Request {part} not received within {seconds:g} seconds.")

    def _idle_timeout(self) -> None:
        """Close a connection the client has sent nothing on for the idle time (between requests, or in the middle
        of one), unless a handler is still answering."""
        self._idle = None
        if self.closed:
            return
        loop = asyncio.get_running_loop()
        idle = self._server.limits.idle_seconds
        quiet = loop.time() - self._active
        if self._busy or self._queue or quiet < idle:
            self._idle = loop.call_later(max(idle - quiet, 0.01) if not self._busy else idle, self._idle_timeout)
            return
        self.close()

    def is_idle(self) -> bool:
        return not self._busy and not self._queue and not self._in_head

    def close(self) -> None:
        """Close after what was written has gone out."""
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()
        self.closed = True

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()
        self.closed = True


class _HeadTooLarge(Exception):
    pass


class FrontServer:
    """Listens, parses and hands each request to `handle`; a request `handle` leaves unanswered gets a 500."""

    def __init__(self, handle: Handler, limits: Limits, error_body: Callable[[int, str], bytes]):
        self.handle = handle
        self.limits = limits
        self.error_body = error_body  # (status, message) -> the body of an error the server answers itself
        self._loop: asyncio.AbstractEventLoop | None = None
        self._conns: set[_Connection] = set()
        self.sources: collections.Counter[str] = collections.Counter()  # open connections per client address
        self._inflight = 0  # requests in handlers that `limits.limited` counts
        self.held_bodies = 0  # bytes of request bodies reserved (limits.max_held_bodies)
        self._tasks: set[asyncio.Task[None]] = set()
        self._server: asyncio.base_events.Server | None = None

    def release_source(self, source: str) -> None:
        self.sources[source] -= 1
        if self.sources[source] <= 0:
            del self.sources[source]

    def error_bytes(self, status: int, message: str, retry_after: bool = False) -> bytes:
        """A whole error response, with Connection: close."""
        return self.response_bytes(status, self.error_body(status, message), retry_after)

    def response_bytes(self, status: int, body: bytes, retry_after: bool = False) -> bytes:
        """A whole JSON response, with Connection: close."""
        framing = b"Content-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n" % len(body)
        if retry_after:
            framing += b"Retry-After: 1\r\n"
        return _status_head(status) + framing + b"\r\n" + body

    async def start(self, host: str, port: int, backlog: int = 1024) -> None:
        loop = self._loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _Connection(self), host, port, backlog=backlog, reuse_address=True
        )

    @property
    def port(self) -> int:
        assert self._server is not None and self._server.sockets
        return int(self._server.sockets[0].getsockname()[1])

    def loop_time(self) -> float:
        assert self._loop is not None  # connections exist only once the server has started
        return self._loop.time()

    def release(self, request: Request) -> None:
        """Give back what `request`'s body reserved (once: it is its handler's end, or the request never runs)."""
        self.held_bodies -= request.held
        request.held = 0

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _handle(self, request: Request) -> None:
        if request.refusal is not None:  # `admit` refused its head
            request.keep_alive = False
            try:
                request.respond(request.status, request.refusal)
            except ClientGone:
                pass
            return
        if request.status == 413:
            request.keep_alive = False
            self._answer_error(request, 413, f"Request body exceeds the limit of {self.limits.max_body()} bytes.")
            return
        if request.status == 503:
            request.keep_alive = False
            self._answer_error(request, 503, BODIES_HELD, {"Retry-After": "1"})
            return
        if request.status == 400:
            request.keep_alive = False
            if "host" in request.headers:
                self._answer_error(request, 400, "A request must carry one Host header, not several.")
            else:
                self._answer_error(request, 400, "HTTP/1.1 requests need a Host header.")
            return
        counted = self.limits.limited(request.method, request.path)
        if counted and self._inflight >= self.limits.max_inflight:
            self.limits.on_reject("inflight")
            self._answer_error(request, 503, "Too many requests in flight; retry shortly.", {"Retry-After": "1"})
            return
        if counted:
            self._inflight += 1
        try:
            await self._run(request)
        finally:
            if counted:
                self._inflight -= 1

    async def _run(self, request: Request) -> None:
        try:
            await self.handle(request)
        except ClientGone:
            request.keep_alive = False
            return
        except Exception:
            log.exception("unhandled error on %s %s", request.method, request.path)
            request.keep_alive = False
            if request.started:
                return
            self._answer_error(request, 500, "Internal router error.")
            return
        if not request.started:
            log.error("no response to %s %s", request.method, request.path)
            self._answer_error(request, 500, "Internal router error.")
        elif not request.finished:
            request.keep_alive = False  # a stream left open: the connection's end ends it

    def _answer_error(self, request: Request, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        try:
            request.respond(status, self.error_body(status, message), headers=headers)
        except ClientGone:
            request.keep_alive = False

    async def stop(self, grace: float = 10.0) -> None:
        """Stop listening, let running requests finish for up to `grace` seconds, then close every connection."""
        if self._server is not None:
            self._server.close()
        for conn in list(self._conns):
            if conn.is_idle():
                conn.close()
        if self._tasks:
            _, pending = await asyncio.wait(list(self._tasks), timeout=grace)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=1.0)
        for conn in list(self._conns):
            conn.abort()
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

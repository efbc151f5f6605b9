"""uvicorn (with httptools) behind the router's server contract: a reference adapter, so that the router's own HTTP
server can be compared with a well-kept one on the same test cases (tests/unit/http1/test_server.py runs against
both) and in the router benchmark (`python -m duplex_dev.uvicorn_front` is `duplex router` served by uvicorn).

It offers what `duplex_sidecars.http1.server.FrontServer` offers (`start`, `port`, `stop`) and hands handlers a
request with the same methods. What uvicorn has no setting for is done here in the ASGI app: the body limit, the
in-flight cap, the Host check. Head and body deadlines have no equivalent in uvicorn and are not enforced.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import uvicorn

from duplex_sidecars.http1.server import ClientGone, Limits

log = logging.getLogger(__name__)

Handler = Callable[["UvicornRequest"], Awaitable[None]]
_END = object()


class UvicornRequest:
    """One ASGI request as the router's handlers see a request. Writes are queued in order and sent by the app."""

    def __init__(self, scope: dict[str, Any], body: bytes, outbox: asyncio.Queue[Any]):
        self.method: str = scope["method"]
        self.path: str = scope.get("raw_path", scope["path"].encode()).decode("latin-1")
        self.query = scope.get("query_string", b"").decode("latin-1")
        self.http11 = scope.get("http_version") == "1.1"
        self.headers: dict[str, str] = {}
        self._repeated: set[str] = set()
        for raw_name, raw_value in scope["headers"]:
            name, value = raw_name.decode("latin-1").lower(), raw_value.decode("latin-1")
            if name in self.headers:
                self.headers[name] += ", " + value
                self._repeated.add(name)
            else:
                self.headers[name] = value
        self.body = body
        self.keep_alive = True
        self.started = False
        self.finished = False
        self.status = 0
        self.gone = False
        self._outbox = outbox

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())

    def repeated(self, name: str) -> bool:
        return name.lower() in self._repeated

    @property
    def client_gone(self) -> bool:
        return self.gone

    def _put(self, message: Any) -> None:
        if self.gone:
            raise ClientGone()
        self._outbox.put_nowait(message)

    def _head(self, status: int, headers: dict[str, str] | None) -> list[tuple[bytes, bytes]]:
        if self.started:
            raise RuntimeError("response already started")
        self.started = True
        self.status = status
        out = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in (headers or {}).items()]
        if not self.keep_alive:
            out.append((b"connection", b"close"))
        return out

    def respond(
        self, status: int, body: bytes, content_type: str = "application/json", headers: dict[str, str] | None = None
    ) -> None:
        head = self._head(status, {"Content-Type": content_type, **(headers or {})})
        head.append((b"content-length", b"%d" % len(body)))
        self.finished = True
        self._put({"type": "http.response.start", "status": status, "headers": head})
        self._put({"type": "http.response.body", "body": body if self.method != "HEAD" else b""})

    def start(self, status: int, headers: dict[str, str] | None = None, first: bytes | bytearray = b"") -> None:
        self._put({"type": "http.response.start", "status": status, "headers": self._head(status, headers)})
        if first:
            self._put({"type": "http.response.body", "body": bytes(first), "more_body": True})

    def write(self, data: bytes | bytearray) -> None:
        if self.finished or not data:
            if self.gone:
                raise ClientGone()
            return
        self._put({"type": "http.response.body", "body": bytes(data), "more_body": True})

    def end(self, data: bytes | bytearray = b"") -> None:
        if self.finished:
            return
        self.finished = True
        self._put({"type": "http.response.body", "body": bytes(data)})

    async def drain(self) -> None:
        """Wait until what was written has been handed to uvicorn (which applies its own flow control)."""
        if self.gone:
            raise ClientGone()
        await self._outbox.join()
        if self.gone:
            raise ClientGone()


class UvicornFront:
    """A server with FrontServer's interface, run by uvicorn."""

    def __init__(self, handle: Handler, limits: Limits, error_body: Callable[[int, str], bytes]):
        self.handle = handle
        self.limits = limits
        self.error_body = error_body
        self._inflight = 0
        self._server: uvicorn.Server | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self, host: str, port: int, backlog: int = 1024) -> None:
        config = uvicorn.Config(
            self._app,
            host=host,
            port=port,
            http="httptools",
            loop="none",  # the running loop (uvloop when the router chose it)
            lifespan="off",
            interface="asgi3",
            log_level="warning",
            access_log=False,
            backlog=backlog,
            timeout_keep_alive=int(self.limits.idle_seconds),
            limit_concurrency=self.limits.max_connections,
        )
        self._server = uvicorn.Server(config)
        self._server.install_signal_handlers = lambda: None  # type: ignore[method-assign]  # the router's own
        self._task = asyncio.get_running_loop().create_task(self._server.serve())
        while not self._server.started:
            if self._task.done():
                self._task.result()  # raises what stopped it (a taken port, ...)
                raise OSError("uvicorn stopped before it started")
            await asyncio.sleep(0.01)

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.servers[0].sockets[0].getsockname()[1])

    async def stop(self, grace: float = 10.0) -> None:
        if self._server is None or self._task is None:
            return
        self._server.config.timeout_graceful_shutdown = max(int(grace), 1)
        self._server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError, TimeoutError):
            await asyncio.wait_for(self._task, grace + 5)
        self._server = None

    async def _error(self, send: Callable[..., Awaitable[None]], status: int, message: str, close: bool) -> None:
        body = self.error_body(status, message)
        headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
        if close:
            headers.append((b"connection", b"close"))
        if status == 503:
            headers.append((b"retry-after", b"1"))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def _app(self, scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
        if scope["type"] != "http":
            return
        headers = {k.decode("latin-1").lower(): v for k, v in scope["headers"]}
        if scope.get("http_version") == "1.1" and "host" not in headers:
            await self._error(send, 400, "HTTP/1.1 requests need a Host header.", True)
            return
        limit = self.limits.max_body()
        length = headers.get("content-length", b"")
        if length.isdigit() and int(length) > limit:
            await self._error(
                send, 413, f"Request body of {int(length)} bytes exceeds the limit of {limit} bytes.", True
            )
            return
        parts: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                await self._error(send, 413, f"Request body exceeds the limit of {limit} bytes.", True)
                return
            parts.append(chunk)
            if not message.get("more_body"):
                break
        counted = self.limits.limited(scope["method"], scope["path"])
        if counted and self._inflight >= self.limits.max_inflight:
            self.limits.on_reject("inflight")
            await self._error(send, 503, "Too many requests in flight; retry shortly.", False)
            return
        outbox: asyncio.Queue[Any] = asyncio.Queue()
        request = UvicornRequest(scope, b"".join(parts), outbox)
        if counted:
            self._inflight += 1
        try:
            await self._serve(request, outbox, receive, send)
        finally:
            if counted:
                self._inflight -= 1

    async def _serve(
        self, request: UvicornRequest, outbox: asyncio.Queue[Any], receive: Callable[..., Any], send: Callable[..., Any]
    ) -> None:
        async def run() -> None:
            try:
                await self.handle(request)
            except ClientGone:
                pass
            except Exception:
                log.exception("unhandled error on %s %s", request.method, request.path)
                request.keep_alive = False
            finally:
                try:
                    if not request.started:
                        request.respond(500, self.error_body(500, "Internal router error."))
                    elif not request.finished:
                        request.end()
                except ClientGone:
                    pass
                outbox.put_nowait(_END)

        async def watch_disconnect() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            request.gone = True

        handler = asyncio.get_running_loop().create_task(run())
        watcher = asyncio.get_running_loop().create_task(watch_disconnect())
        try:
            while True:
                message = await outbox.get()
                try:
                    if message is _END:
                        break
                    await send(message)
                except OSError:
                    request.gone = True
                finally:
                    outbox.task_done()
            await handler
        finally:
            watcher.cancel()
            handler.cancel()


def main(argv: list[str] | None = None) -> int:
    """`duplex router`, served by uvicorn (for the router benchmark's side-by-side comparison)."""
    from duplex_sidecars.router import cli

    return cli.main(argv, server_class=UvicornFront)


if __name__ == "__main__":
    sys.exit(main())

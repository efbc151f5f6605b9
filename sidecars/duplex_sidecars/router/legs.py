"""The two HTTP legs of a P-D request: the one-token prefill call and the decode call whose response is relayed.

This is the router's side of the transport: `LegClient` sends the legs over `http1`'s client and hands the request
path prefill's JSON reply and decode's `DecodeAnswer`, never the HTTP client's own types. Failures come out as
`LegFailure` with a kind that decides whether another attempt is worth it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from collections.abc import Mapping
from typing import Any

import aiohttp
import aiohttp.abc

from duplex_sidecars.http1.client import EngineClient, EngineConnectError, EngineResponse
from duplex_sidecars.router import jsonio
from duplex_sidecars.router.attempts import BROKEN, CONNECT, STATUS_4XX, STATUS_5XX, TIMEOUT, may_resend_stale
from duplex_sidecars.router.config import TimeoutsConfig

log = logging.getLogger(__name__)

# A prefill carrying decode's blocks is never resent, so it only takes a pooled connection used this recently: an
# engine closes idle keep-alive connections after its own timeout (vLLM's HTTP server: 5 s by default).
REPLAY_MAX_IDLE_SECONDS = 1.0


def json_reply(raw: bytes, leg: str) -> tuple[dict[str, Any], bool]:
    """An engine's JSON object reply, and whether it was read exactly (jsonio); a broken leg if it is not one."""
    try:
        reply, exact = jsonio.loads(raw)
    except ValueError as exc:
        raise LegFailure(BROKEN, f"{leg} reply is not JSON: {exc}") from exc
    if not isinstance(reply, dict):
        raise LegFailure(BROKEN, f"{leg} reply is not a JSON object")
    return reply, exact


class LegFailure(Exception):
    def __init__(self, kind: str, detail: str, status: int | None = None, body: bytes | None = None):
        super().__init__(detail)
        self.kind = kind
        self.detail = detail
        self.status = status
        self.body = body


def nodelay_socket(addr_info: Any) -> socket.socket:
    """Client sockets with Nagle off from the start: a request's header and body writes must not wait for an ACK."""
    family, type_, proto, _, _ = addr_info
    sock = socket.socket(family=family, type=type_, proto=proto)
    if family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def make_session(resolver: aiohttp.abc.AbstractResolver | None = None) -> aiohttp.ClientSession:
    """The aiohttp session for health probes and other requests off the hot path. `resolver` overrides name
    resolution of engine hosts."""
    connector = aiohttp.TCPConnector(
        limit=0,
        keepalive_timeout=60,
        socket_factory=nodelay_socket,
        enable_cleanup_closed=False,
        resolver=resolver,
    )
    # Engines set no cookies, and the router must never carry one from one client's request to another's.
    return aiohttp.ClientSession(
        connector=connector,
        timeout=aiohttp.ClientTimeout(total=None),
        auto_decompress=True,
        cookie_jar=aiohttp.DummyCookieJar(),
    )


def make_leg_client(resolver: aiohttp.abc.AbstractResolver | None = None) -> LegClient:
    """The client for the prefill and decode legs, resolving engine hosts the way the session does."""
    if resolver is None:
        return LegClient(EngineClient())

    async def resolve(host: str, port: int) -> str:
        found = await resolver.resolve(host, port, socket.AF_INET)
        if not found:
            raise OSError(f"cannot resolve {host}")
        return str(found[0]["host"])

    return LegClient(EngineClient(resolve))


def leg_headers(request_id: str, api_key: str | None, trace: Mapping[str, str] | None = None) -> dict[str, str]:
    """A leg's headers; `trace`: the W3C trace context of the leg's span (router/tracing.py), when tracing is on."""
    headers = {"Content-Type": "application/json", "X-Request-Id": request_id}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    if trace:
        headers.update(trace)
    return headers


def _classify(exc: BaseException) -> LegFailure:
    if isinstance(exc, EngineConnectError):
        return LegFailure(CONNECT, str(exc))
    if isinstance(exc, asyncio.TimeoutError):
        return LegFailure(TIMEOUT, "timed out")
    return LegFailure(BROKEN, f"{type(exc).__name__}: {exc}")


async def _status_failure(resp: EngineResponse) -> LegFailure:
    try:
        async with asyncio.timeout(10):
            body = await resp.read()
    except (TimeoutError, ConnectionError):
        body = b""
    finally:
        resp.release()
    if resp.status in (401, 403):
        # The engine refused the router's own credentials (engine_api_key_env): a fault of this deployment, not of
        # the client, whose own key the router has already accepted. Never passed on as the client's 401.
        log.error(
            "an engine answered HTTP %d to the router: is engine_api_key_env set to the engines' key?", resp.status
        )
        return LegFailure(STATUS_5XX, f"HTTP {resp.status}: the engine refused the router's engine key")
    kind = STATUS_4XX if 400 <= resp.status < 500 else STATUS_5XX
    return LegFailure(kind, f"HTTP {resp.status}", status=resp.status, body=body)


class LegClient:
    """Sends the legs over one keep-alive HTTP client (its connections pooled per engine)."""

    def __init__(self, client: EngineClient):
        self._client = client

    async def prefill(
        self,
        base: str,
        path: str,
        body: bytes,
        headers: dict[str, str],
        timeouts: TimeoutsConfig,
        *,
        replay: bool = False,
    ) -> tuple[dict[str, Any], bool]:
        """Run the prefill leg (`body` is the JSON to send, carrying decode's blocks when `replay`) on the engine at
        `base`; returns prefill's JSON reply and whether the request had to go out twice (a stale keep-alive
        connection)."""
        resp: EngineResponse | None = None
        try:
            async with asyncio.timeout(timeouts.replay_prefill_seconds if replay else timeouts.prefill_seconds):
                resp = await self._client.post(
                    base,
                    path,
                    body,
                    headers,
                    timeouts.connect_seconds,
                    resend_stale=may_resend_stale(replay),
                    max_idle=REPLAY_MAX_IDLE_SECONDS if replay else None,
                )
                if resp.status != 200:
                    raise await _status_failure(resp)
                raw = await resp.read()
        except LegFailure:
            raise
        except (TimeoutError, OSError) as exc:  # EngineConnectError and EngineDisconnected too
            if resp is not None:
                resp.close()
            raise _classify(exc) from exc
        reply, _ = json_reply(raw, "prefill")
        return reply, resp.resent

    async def open_decode(
        self, base: str, path: str, body: bytes, headers: dict[str, str], timeouts: TimeoutsConfig
    ) -> DecodeAnswer:
        """Start the decode leg (`body` is the JSON to send) on the engine at `base`; returns its open 200 answer
        (the caller reads it, then finishes or closes it)."""
        try:
            async with asyncio.timeout(timeouts.decode_first_byte_seconds):
                resp = await self._client.post(base, path, body, headers, timeouts.connect_seconds)
        except (TimeoutError, OSError) as exc:  # EngineConnectError and EngineDisconnected too
            raise _classify(exc) from exc
        if resp.status != 200:
            raise await _status_failure(resp)
        return DecodeAnswer(resp)

    async def close(self) -> None:
        await self._client.close()


class DecodeAnswer:
    """Decode's open 200 answer, as the relay reads it: whole (`read_body`) or as it arrives (`reader`). Closing it
    cuts its connection, which makes the engine abort the request."""

    __slots__ = ("_resp",)

    def __init__(self, resp: EngineResponse):
        self._resp = resp

    @property
    def resent(self) -> bool:
        """The request went out twice (a stale keep-alive connection)."""
        return self._resp.resent

    async def read_body(self, idle_seconds: float) -> bytes:
        """The whole body; its connection then goes back to the pool."""
        raw = await read_body(self._resp, idle_seconds)
        self._resp.release()
        return raw

    def reader(self, idle_seconds: float) -> ChunkReader:
        return ChunkReader(self._resp, idle_seconds)

    def close(self) -> None:
        self._resp.close()


class _Idle(Exception):
    """Set on a response by `ChunkReader`'s timer: wakes the waiting read."""


class ChunkReader:
    """A response body as it arrives; a gap longer than `idle_seconds` while waiting for data is TIMEOUT, a dropped
    connection BROKEN. Close it when done.

    One timer per stream, not one per read: each read only notes when it started waiting, and the timer, when it
    fires, either ends the wait that has gone on too long or sets itself again for the earliest moment one could."""

    def __init__(self, resp: EngineResponse, idle_seconds: float):
        self._resp = resp
        self._idle = idle_seconds
        self._loop = asyncio.get_running_loop()
        self._since = self._loop.time()
        self._waiting = False
        self._timer: asyncio.TimerHandle | None = self._loop.call_at(self._since + idle_seconds, self._check)

    def _check(self) -> None:
        now = self._loop.time()
        if not self._waiting:
            self._timer = self._loop.call_at(now + self._idle, self._check)  # no wait can end before this
        elif now >= self._since + self._idle:
            self._timer = None
            self._resp.set_exception(_Idle())
        else:
            self._timer = self._loop.call_at(self._since + self._idle, self._check)

    async def read(self) -> bytes:
        """The next data available (everything buffered, in one piece); b"" at the end of the body."""
        self._since = self._loop.time()
        self._waiting = True
        try:
            return await self._resp.read_any()
        except _Idle as exc:
            raise LegFailure(TIMEOUT, f"no data for {self._idle:g}s") from exc
        except OSError as exc:
            raise LegFailure(BROKEN, f"{type(exc).__name__}: {exc}") from exc
        finally:
            self._waiting = False

    def finish(self, end_within: float) -> None:
        """Done reading: the response's connection goes back to the pool once the body has ended, which for a stream
        usually happens just after its last event; a body that broke, or has not ended within `end_within` seconds,
        is closed instead."""
        self.close()
        resp = self._resp
        if resp.is_eof():
            resp.release()
        elif end_within <= 0 or resp.exception() is not None:
            resp.close()
        else:
            closer = self._loop.call_later(end_within, resp.close)
            resp.on_eof(closer.cancel)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


async def read_body(resp: EngineResponse, idle_seconds: float) -> bytes:
    reader = ChunkReader(resp, idle_seconds)
    try:
        parts = []
        while chunk := await reader.read():
            parts.append(chunk)
        return b"".join(parts)
    finally:
        reader.close()


def engine_error_body(failure: LegFailure) -> dict[str, Any] | None:
    """An engine's 4xx error in OpenAI shape, to pass on to the client; None when it has no usable body."""
    try:
        parsed = json.loads(failure.body or b"")
    except ValueError:
        return None
    if not isinstance(parsed, dict):
        return None
    # vLLM's older ErrorResponse is flat: {"object": "error", "message", "type", "code"}
    err = parsed["error"] if isinstance(parsed.get("error"), dict) else parsed
    return {
        "error": {
            "message": str(err.get("message", failure.detail)),
            "type": str(err.get("type", "invalid_request_error")),
            "code": err.get("code", failure.status),
        }
    }

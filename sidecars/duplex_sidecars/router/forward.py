"""Forwarding one client request through prefill and decode: pick engines, run the legs with their retries, relay
decode's answer without kv_transfer_params, and record what decode retained for the conversation's next turn."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import orjson

from duplex_sidecars import protocol
from duplex_sidecars.router import jsonio, legs, reuse
from duplex_sidecars.router.endpoints import Engine
from duplex_sidecars.router.engine_client import EngineResponse
from duplex_sidecars.router.errors import (
    BackendFailed,
    BackendUnavailable,
    RouterError,
    sse_error_event,
)
from duplex_sidecars.router.front import Request
from duplex_sidecars.router.history import Reply
from duplex_sidecars.router.legs import CONNECT, STATUS_4XX, TIMEOUT, LegFailure
from duplex_sidecars.router.reply import (
    ReplyCollector,
    pop_kv_params,
    reply_of_body,
    strip_kv_params,
)
from duplex_sidecars.router.sse import DONE, SSEEvent, SSEParser, encode_data
from duplex_sidecars.router.turn import Turn

if TYPE_CHECKING:
    from duplex_sidecars.router.app import Router

log = logging.getLogger(__name__)

_KV_MARKER = protocol.KV_PARAMS_FIELD.encode()
_ESCAPE = b"\\u"  # a JSON \u escape: a key could spell kv_transfer_params without the marker's bytes
_DONE_EVENT = b"data: [DONE]\n\n"
_END_OF_BODY_SECONDS = 5.0  # how long a finished decode stream may take to end its body before its connection is closed


class EngineError(RouterError):
    """An engine's own 4xx answer, passed on to the client as it was (in OpenAI shape)."""

    def __init__(self, failure: LegFailure):
        body = legs.engine_error_body(failure)
        err = (body or {}).get("error") or {}
        super().__init__(
            err.get("message") or f"engine rejected the request ({failure.detail})",
            status=failure.status or 400,
            type=err.get("type") or "invalid_request_error",
            code=err.get("code"),
        )


def _leg_error(leg: str, failures: list[LegFailure]) -> RouterError:
    last = failures[-1]
    if last.kind == STATUS_4XX:
        return EngineError(last)
    if all(f.kind == CONNECT for f in failures):
        return BackendUnavailable(f"No {leg} engine could be reached.")
    if last.kind == TIMEOUT:
        return RouterError(f"The {leg} engine timed out.", status=504, type="timeout")
    return BackendFailed(f"The {leg} engine failed ({last.detail}).")


class Forwarder:
    def __init__(self, router: Router):
        self.r = router

    # ---- prefill -------------------------------------------------------------------------------------------------

    async def _prefill(self, turn: Turn, decision: reuse.Decision | None, attempt_tag: str) -> dict[str, Any] | None:
        """Run the prefill leg with its retries; returns prefill's kv_transfer_params (None: decode recomputes).
        Only the very first attempt of a request may carry replayed blocks."""
        cfg = self.r.config
        metrics = self.r.metrics
        pool = self.r.engines.prefill
        if len(pool) == 0:
            raise BackendUnavailable("No prefill engines are available.")
        failures: list[LegFailure] = []
        tried: list[str] = []
        replay = decision.params if decision is not None else None
        attempts = cfg.prefill_retries + 1
        attempt = -1
        while attempt + 1 < attempts:
            attempt += 1
            replaying = replay is not None and attempt == 0
            engine = pool.pick(exclude=tried)
            if engine is None:
                break
            tried.append(engine.url)
            kv = replay if replaying and replay is not None else protocol.miss_params()
            body = turn.encode(protocol.prefill_leg_body(turn.body, kv))
            headers = legs.leg_headers(
                turn.request_id + attempt_tag + (f"-p{attempt}" if attempt else ""), self.r.engine_api_key
            )
            started = time.perf_counter()
            try:
                with pool.busy(engine):
                    reply = await legs.prefill(self.r.engine_client, engine.url, turn.path, body, headers, cfg.timeouts)
            except LegFailure as failure:
                metrics.backend_errors.labels("prefill", failure.kind).inc()
                failures.append(failure)
                log.warning(
                    "request %s: prefill leg on %s failed%s: %s",
                    turn.request_id,
                    engine.url,
                    " while replaying decode's blocks" if replaying else "",
                    failure.detail,
                )
                if failure.kind == CONNECT:
                    pool.mark(engine, False, failure.detail)
                if replaying:
                    # The replayed blocks may be the cause (declined, gone, rejected): whatever the failure, the
                    # client is owed one plain recompute before any error.
                    metrics.miss("prefill_retry")
                    attempts = max(attempts, 2)
                elif not failure.retryable or failure.kind == TIMEOUT:
                    break
                if attempt + 1 < attempts:
                    metrics.retries.labels("prefill").inc()
                continue
            metrics.leg_duration.labels("prefill").observe(time.perf_counter() - started)
            if replaying:
                metrics.reuse_hits.inc()
                metrics.reused_tokens.inc(decision.tokens if decision else 0)
            params = reply.get(protocol.KV_PARAMS_FIELD)
            if not isinstance(params, dict):
                log.info(
                    "request %s: prefill on %s returned no kv_transfer_params; decode recomputes",
                    turn.request_id,
                    engine.url,
                )
                return None
            return params
        if not failures:
            raise BackendUnavailable("No prefill engines are available.")
        raise _leg_error("prefill", failures)

    # ---- the request ---------------------------------------------------------------------------------------------

    async def handle(self, request: Request, turn: Turn) -> int:
        """Answer the request through prefill and decode; returns the HTTP status the client got."""
        cfg = self.r.config
        metrics = self.r.metrics
        decode_pool = self.r.engines.decode
        decision = await reuse.lookup(self.r.store, turn, decode_pool, metrics)
        if decision.params is None:
            metrics.miss(decision.reason or "no_entry")
        log.debug(
            "request %s conv=%s: %s",
            turn.request_id,
            turn.key and turn.key[:12],
            "replay" if decision.params else f"miss ({decision.reason})",
        )
        failures: list[LegFailure] = []
        tried: list[str] = []
        for attempt in range(cfg.decode_retries + 1):
            tag = f"-d{attempt}" if attempt else ""
            # A decode retry needs a fresh prefill: P's blocks were prepared for one decode read.
            prefill_params = await self._prefill(turn, decision if attempt == 0 else None, tag)
            if len(decode_pool) == 0:
                raise BackendUnavailable("No decode engines are available.")
            engine = decode_pool.pick(exclude=tried, prefer=decision.sticky_decode if attempt == 0 else None)
            if engine is None:
                raise BackendUnavailable("No decode engines are available.")
            tried.append(engine.url)
            body = turn.encode(protocol.decode_leg_body(turn.body, prefill_params))
            headers = legs.leg_headers(turn.request_id + tag, self.r.engine_api_key)
            started = time.perf_counter()
            with decode_pool.busy(engine):
                try:
                    resp = await legs.open_decode(
                        self.r.engine_client, engine.url, turn.path, body, headers, cfg.timeouts
                    )
                except LegFailure as failure:
                    failures.append(self._decode_failed(turn, engine, failure))
                    if not failure.retryable:
                        break
                    if attempt < cfg.decode_retries:
                        metrics.retries.labels("decode").inc()
                    continue
                metrics.leg_duration.labels("decode").observe(time.perf_counter() - started)
                # The relay gives the connection back when it is done with the response. Anything else closes it:
                # dropping the connection makes the engine abort the request.
                try:
                    if turn.stream:
                        await self._relay_stream(request, turn, engine, resp)
                    else:
                        await self._relay_body(request, turn, engine, resp)
                except LegFailure as failure:  # failed before the client saw a byte: worth another try
                    resp.close()
                    failures.append(self._decode_failed(turn, engine, failure))
                    if attempt < cfg.decode_retries:
                        metrics.retries.labels("decode").inc()
                    continue
                except BaseException:
                    resp.close()
                    raise
            return request.status
        if not failures:
            raise BackendUnavailable("No decode engines are available.")
        raise _leg_error("decode", failures)

    def _decode_failed(self, turn: Turn, engine: Engine, failure: LegFailure) -> LegFailure:
        self.r.metrics.backend_errors.labels("decode", failure.kind).inc()
        log.warning("request %s: decode leg on %s failed: %s", turn.request_id, engine.url, failure.detail)
        if failure.kind == CONNECT:
            self.r.engines.decode.mark(engine, False, failure.detail)
        return failure

    async def _record(self, turn: Turn, engine: Engine, kv_params: Any, reply: Reply) -> None:
        try:
            outcome = await reuse.record(
                self.r.store, turn, engine.url, kv_params, reply, self.r.config.conversation.ttl_seconds, self.r.metrics
            )
        except Exception:  # recording is an optimisation: it must never cost the client its answer
            log.exception("request %s: recording decode's blocks failed", turn.request_id)
            outcome = "not_stored"
        self.r.metrics.captures.labels(outcome).inc()

    async def _answer_and_record(
        self, turn: Turn, engine: Engine, kv_params: Any, reply: Reply, answer: Callable[[], None]
    ) -> None:
        """Send the client the end of its answer and store what decode retained, so that the client's next turn
        always finds the entry. A store that never waits takes the entry right after the answer is written: nothing
        else runs on the event loop in between, and storing is then off the client's critical path. Any other store
        takes it first."""
        if turn.key is None or self.r.store.immediate:
            try:
                answer()
            finally:
                await self._record(turn, engine, kv_params, reply)
        else:
            await self._record(turn, engine, kv_params, reply)
            answer()

    # ---- non-streaming -------------------------------------------------------------------------------------------

    async def _relay_body(self, request: Request, turn: Turn, engine: Engine, resp: EngineResponse) -> None:
        raw = await legs.read_body(resp, self.r.config.timeouts.decode_idle_seconds)
        resp.release()  # read to its end: the connection goes back to the pool
        try:
            body, exact = jsonio.loads(raw)
        except ValueError as exc:
            raise LegFailure(legs.BROKEN, f"decode reply is not JSON: {exc}") from exc
        if not isinstance(body, dict):
            raise LegFailure(legs.BROKEN, "decode reply is not a JSON object")
        kv_params = pop_kv_params(body)
        # A reply only the lenient parser could read (NaN, ...) is relayed but not compared: a tombstone is stored.
        reply = reply_of_body(turn.route, body) if exact else Reply(choices=0)
        out = jsonio.dumps(body, exact)
        await self._answer_and_record(
            turn, engine, kv_params, reply, lambda: request.respond(200, out, headers={"X-Request-Id": turn.request_id})
        )

    # ---- streaming -----------------------------------------------------------------------------------------------

    async def _relay_stream(self, request: Request, turn: Turn, engine: Engine, resp: EngineResponse) -> None:
        reader = legs.ChunkReader(resp, self.r.config.timeouts.decode_idle_seconds)
        relay = _StreamRelay(ReplyCollector(turn.route) if turn.key else None)
        try:
            await self._relay_events(request, turn, engine, reader, relay)
        finally:
            reader.close()
        # The end of decode's chunked body usually comes just after [DONE]: the connection then goes back to the pool
        # for the next leg, without holding up this handler (the client has its answer already).
        reader.finish(resp, _END_OF_BODY_SECONDS if relay.finished else 0)

    async def _relay_events(
        self, request: Request, turn: Turn, engine: Engine, reader: legs.ChunkReader, relay: _StreamRelay
    ) -> None:
        parser = SSEParser()
        try:
            # Whatever arrived since the last read goes out in one write.
            while chunk := await reader.read():
                batch = relay.take_plain(parser, chunk)
                if batch is None:
                    batch = relay.take(parser.feed(chunk))
                if batch:
                    self._send(request, turn, batch)
                    await request.drain()
                if relay.finished:
                    break
            else:
                batch = relay.take(parser.close())  # an unterminated last event still counts
                if batch:
                    self._send(request, turn, batch)
        except LegFailure as failure:
            if not request.started:
                raise
            self._decode_failed(turn, engine, failure)
            return self._end_stream_with_error(turn, request, "The decode engine's stream broke off.")
        except ValueError as exc:  # an event beyond the parser's size limit
            if not request.started:
                raise LegFailure(legs.BROKEN, str(exc)) from exc
            self._decode_failed(turn, engine, LegFailure(legs.BROKEN, str(exc)))
            return self._end_stream_with_error(turn, request, "The decode engine's stream was malformed.")
        if not relay.finished:
            if not request.started:
                raise LegFailure(legs.BROKEN, "decode stream ended without data")
            self._decode_failed(turn, engine, LegFailure(legs.BROKEN, "decode stream ended without [DONE]"))
            return self._end_stream_with_error(turn, request, "The decode engine's stream ended unexpectedly.")
        relay.held += _DONE_EVENT
        if relay.collector is not None:
            await self._answer_and_record(
                turn,
                engine,
                relay.kv_params,
                relay.collector.reply(),
                lambda: self._send(request, turn, relay.held, last=True),
            )
        else:
            self._send(request, turn, relay.held, last=True)
        self.r.metrics.e2e.labels(turn.route, "true").observe(time.perf_counter() - turn.started)

    def _send(self, request: Request, turn: Turn, data: bytes | bytearray, last: bool = False) -> None:
        """Send data to the client, starting the response with it first; `last` ends it in the same write.
        ClientGone if the client has left."""
        if not request.started:
            request.start(
                200,
                {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Request-Id": turn.request_id},
                data,
            )
            self.r.metrics.ttft.labels(turn.route, "true").observe(time.perf_counter() - turn.started)
            data = b""
        if last:
            request.end(data)
        else:
            request.write(data)

    def _end_stream_with_error(self, turn: Turn, request: Request, message: str) -> None:
        self.r.metrics.e2e.labels(turn.route, "true").observe(time.perf_counter() - turn.started)
        request.write(sse_error_event(message, "server_error", 502))
        request.end()


class _StreamRelay:
    """What happens to decode's SSE events on their way to the client: kv_transfer_params come out, the reply is
    collected, and everything from the kv-carrying final chunk on is held until the conversation entry is stored
    (so a client that fires its next turn on the last chunk still finds it).

    Events go out as their raw bytes. Only an event whose bytes could spell kv_transfer_params (the name itself, or
    any \\u escape) is parsed for stripping and then written anew; the others are parsed only when the reply is
    being collected."""

    def __init__(self, collector: ReplyCollector | None):
        self.collector = collector
        self.kv_params: Any = None
        self.held = bytearray()
        self.finished = False

    def take(self, events: list[SSEEvent]) -> bytes | bytearray:
        """Process events; returns the bytes to send now."""
        batch = bytearray()
        for event in events:
            if self.finished:
                break
            raw = self._filter(event)
            if raw is not None:
                (self.held if self.kv_params is not None else batch).extend(raw)
        return batch

    def take_plain(self, parser: SSEParser, chunk: bytes) -> bytes | None:
        """`take` for the common chunk in one step: plain token events that cannot carry the params go out as the
        chunk's own bytes, with no event objects; a final [DONE] ends the stream. None when the chunk needs the
        event-by-event path (nothing consumed then)."""
        if self.finished or self.kv_params is not None or _KV_MARKER in chunk or _ESCAPE in chunk:
            return None
        split = parser.split_plain(chunk)
        if split is None:
            return None
        region, datas, rest = split
        done = datas[-1] == DONE
        if done:
            datas.pop()
            region = region[: -len(_DONE_EVENT)]
        if DONE in datas:  # [DONE] before the last event: the event-by-event path stops at it
            return None
        if self.collector is not None:
            for data in datas:
                self._collect(data)
        if done:
            self.finished = True  # what follows [DONE] is ignored, as `take` does
        else:
            parser.take_rest(rest)
        return region

    def _filter(self, event: SSEEvent) -> bytes | None:
        data = event.data
        if data is None:
            return event.raw
        if data == DONE:
            self.finished = True
            return None  # [DONE] goes out after the entry is stored
        raw = event.raw
        marked = _KV_MARKER in raw or _ESCAPE in raw
        if not marked:
            if self.collector is not None:
                self._collect(data)
            return raw
        try:  # an event that may carry the params: parsed to be written anew without them
            obj, exact = _event_json(data, True)
        except ValueError:
            return None  # unparseable and possibly internal: dropped
        if not isinstance(obj, dict):
            return None
        if self.collector is not None:
            self.collector.add(obj, exact)
        found, present = strip_kv_params(obj)
        if found is not None:
            self.kv_params = found
        if not present:
            return raw
        return encode_data(jsonio.dumps(obj, exact))

    def _collect(self, data: bytes) -> None:
        """Show the collector an event that goes out as it is (the common case, kept lean: one per token)."""
        try:
            obj, exact = orjson.loads(data), True
        except orjson.JSONDecodeError:
            try:
                obj, exact = _event_json(data, False)  # NaN, bytes that are not UTF-8, ...
            except ValueError:
                return
        if type(obj) is dict:
            self.collector.add(obj, exact)  # type: ignore[union-attr]


def _event_json(data: bytes, written_back: bool) -> tuple[Any, bool]:
    try:
        return jsonio.loads(data, written_back)
    except UnicodeDecodeError:  # bytes that are not UTF-8 read as U+FFFD, as SSE clients read them
        return jsonio.loads(data.decode("utf-8", "replace"), written_back)

"""The request path: one client request, already read into a `Turn`, through prefill and decode.

  1. lookup   Take the conversation's entry from the store (single use) and decide: replay decode's retained
              blocks, or a miss with its reason (`reuse.decide`).
  2. prefill  The one-token prefill leg. On a hit it carries decode's blocks, which prefill reads over NIXL
              (D->P); otherwise the miss payload makes it compute the prompt. Failures are retried as `attempts`
              says: only the first try replays, and a failed replay is owed one recompute.
  3. decode   The decode leg, with prefill's kv_transfer_params, on the decode engine that holds the conversation
              (sticky) when it can. A failure before the client has seen a byte goes back to 2: prefill's blocks
              serve one decode read, so a decode retry needs a fresh prefill.
  4. relay    Decode's answer to the client, kv_transfer_params taken out: a JSON body, or SSE events as they come
              (`relay.StreamRelay`); the end of a stream is held back until 5 is done.
  5. record   What decode retained after this turn, stored under the conversation for its next turn
              (`reuse.after_decode`). With a store that never waits it is stored right after the client's last
              byte (nothing else runs in between), otherwise right before it; either way the next turn finds it.

The steps are marked `# 1.` to `# 5.` below. Everything a request uses comes in through `Deps`.

Before 1. the request is given its KV revision (`Engines.target_revision`): every attempt of both legs goes to engines
of that revision only, and stored blocks of another revision are a miss, so a prefill engine never meets a decode
engine it cannot exchange blocks with.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from duplex_sidecars import protocol
from duplex_sidecars.router import attempts, jsonio, legs, receipt, reuse
from duplex_sidecars.router.attempts import BROKEN, CONNECT, STATUS_4XX, STATUS_5XX, TIMEOUT
from duplex_sidecars.router.calibration import Calibration, tokens_of
from duplex_sidecars.router.config import RouterConfig
from duplex_sidecars.router.endpoints import DECODE, PREFILL, Engine, Engines
from duplex_sidecars.router.errors import BackendFailed, BackendUnavailable, RouterError
from duplex_sidecars.router.exchange import Exchange
from duplex_sidecars.router.fabric import FabricWatch
from duplex_sidecars.router.history import Reply
from duplex_sidecars.router.leg_costs import LegCosts
from duplex_sidecars.router.legs import LegFailure
from duplex_sidecars.router.metrics import RouterMetrics
from duplex_sidecars.router.picker import Hints, Picker
from duplex_sidecars.router.relay import StreamRelay
from duplex_sidecars.router.sse import SSEParser
from duplex_sidecars.router.store import ENDPOINT_GONE, Entry, Store, StoreError
from duplex_sidecars.router.turn import Turn

if TYPE_CHECKING:  # router/tracing.py loads OpenTelemetry: only when tracing is on
    from duplex_sidecars.router.tracing import LegTrace, RequestTrace, RouterTracer

log = logging.getLogger(__name__)

_END_OF_BODY_SECONDS = 5.0  # how long a finished decode stream may take to end its body before its connection closes


@dataclass(frozen=True)
class Deps:
    """What the request path may use; the router builds a new one when its config is reloaded."""

    config: RouterConfig
    engines: Engines
    pickers: dict[str, Picker]
    store: Store
    client: legs.LegClient
    metrics: RouterMetrics
    engine_api_key: str | None = None
    fabric: FabricWatch | None = None  # told which engines read whose blocks
    calibration: Calibration | None = None  # told what each prefill leg cost
    leg_costs: LegCosts | None = None  # what a prefill leg is expected to compute, for the cost placement
    tracer: RouterTracer | None = None  # tracing on (router/tracing.py); None: off, nothing traced


@dataclass
class Context:
    """One request on its way through the steps."""

    turn: Turn
    exchange: Exchange
    decision: reuse.Decision = field(default_factory=lambda: reuse.Decision(None, None))
    revision: str | None = None  # the KV revision both legs go to (None: any engine)
    failures: list[LegFailure] = field(default_factory=list)  # decode's, for the final error
    replayed: bool = False  # a prefill leg that carried decode's blocks succeeded
    prefill_url: str | None = None  # the prefill engine that answered
    prefill_seconds: float | None = None  # how long its leg took
    decode_url: str | None = None  # the decode engine that answered
    decode_started: float | None = None  # when the decode leg being relayed began (perf_counter)
    miss_reason: str | None = None  # why the prefill leg recomputed, when it did
    trace: RequestTrace | None = None  # the request's spans when tracing is on
    decode_leg: LegTrace | None = None  # the span of the decode leg being relayed

    def receipt(self) -> dict[str, str]:
        """The Server-Timing header of the answer starting now (router/receipt.py); {} when receipts are off."""
        turn = self.turn
        if not turn.receipts:
            return {}
        now = time.perf_counter()
        decode = now - self.decode_started if self.decode_started is not None else None
        kv = receipt.verdict(self.replayed, self.decision.tokens, self.miss_reason, turn.shared_tenant)
        return {"Server-Timing": receipt.server_timing(now - turn.started, self.prefill_seconds, decode, kv)}

    def exemplar(self) -> dict[str, str] | None:
        """The trace of this request, for the TTFT histogram (a slow turn links to its trace); None untraced."""
        return self.trace.exemplar() if self.trace is not None else None

    @property
    def reuse_label(self) -> str:
        return "hit" if self.replayed else "miss"


async def handle(deps: Deps, exchange: Exchange, turn: Turn, trace: RequestTrace | None = None) -> int:
    """Answer the request through prefill and decode; returns the HTTP status the client got. `trace`: the request's
    span when tracing is on (the legs' spans go under it)."""
    return (await serve(deps, exchange, turn, trace)).exchange.status


async def serve(deps: Deps, exchange: Exchange, turn: Turn, trace: RequestTrace | None = None) -> Context:
    """`handle`, returning what the request went through (the router's canary reads it)."""
    if len(deps.engines.prefill) == 0:
        raise BackendUnavailable("No prefill engines are available.")
    if len(deps.engines.decode) == 0:
        raise BackendUnavailable("No decode engines are available.")
    ctx = Context(turn, exchange, revision=deps.engines.target_revision(), trace=trace)
    try:
        return await _serve(deps, ctx)
    finally:
        if trace is not None:
            trace.verdict(ctx.replayed, ctx.miss_reason, ctx.decision.tokens)


async def _serve(deps: Deps, ctx: Context) -> Context:
    turn, exchange = ctx.turn, ctx.exchange
    ctx.decision = await lookup(deps, turn, ctx.revision)  # 1.
    ctx.miss_reason = None if ctx.decision.hit else ctx.decision.reason or "no_entry"
    tried: set[str] = set()
    attempt = 0
    engine: Engine | None = None  # a retry's decode, picked before its prefill
    while True:
        prefill_params = await prefill(deps, ctx, attempt)  # 2.
        # 3. decode, on the engine holding the conversation on the first try
        engine = engine or pick_decode(deps, ctx, tried, ctx.decision.sticky_decode)
        if engine is None:
            raise BackendUnavailable("No decode engines are available.")
        tried.add(engine.url)
        try:
            await decode(deps, ctx, engine, attempt, prefill_params)  # 3. to 5.
            ctx.decode_url = engine.url
            return ctx
        except LegFailure as failure:
            ctx.failures.append(decode_failed(deps, turn, engine, failure))
            if not attempts.may_retry_decode(attempt, failure.kind, exchange.started, deps.config.decode_retries):
                raise leg_error(DECODE, ctx.failures) from None
            # A retry costs a fresh prefill: not worth it when the only decode left is one that refused this request.
            engine = pick_decode(deps, ctx, tried)
            if engine is None or (engine.url in tried and engine.healthy is False):
                raise leg_error(DECODE, ctx.failures) from None
            deps.metrics.retries.labels(DECODE).inc()
            attempt += 1


def pick_decode(deps: Deps, ctx: Context, tried: set[str], sticky: str | None = None) -> Engine | None:
    return deps.pickers[DECODE].pick(deps.engines.decode, Hints(frozenset(tried), sticky, revision=ctx.revision))


# ---- 1. lookup ------------------------------------------------------------------------------------------------------


async def lookup(deps: Deps, turn: Turn, revision: str | None = None) -> reuse.Decision:
    """Take the conversation's entry (single use) and decide for a request going to KV `revision`; never raises."""
    decision = reuse.needs_lookup(turn)
    if decision is None:
        assert turn.key is not None
        entry: Any
        try:
            entry = await deps.store.take(turn.key)
        except StoreError:
            deps.metrics.store_errors.labels("take").inc()
            entry = reuse.STORE_FAILED
        else:
            if entry is not None:
                observe_store_bytes(deps)
                observe_turn_gap(deps, entry)
        decode = deps.engines.decode
        cfg = deps.config.reuse
        decision = reuse.decide(
            turn,
            entry,
            decode,
            cfg.min_tokens,
            decode.unhealthy_urls(),
            cfg.check_side_channel_host,
            revision,
            decode.revision_of,
        )
    if not decision.hit:
        deps.metrics.miss(decision.reason or "no_entry")
    log.debug(
        "request %s conv=%s: %s",
        turn.request_id,
        turn.key and turn.key[:12],
        "replay" if decision.hit else f"miss ({decision.reason})",
    )
    return decision


def observe_turn_gap(deps: Deps, entry: Entry) -> None:
    """How long ago the conversation's previous turn was stored, from what was left of its TTL. An endpoint-gone
    tombstone's time is when its engine left, not when the turn was stored."""
    if entry.remaining is not None and entry.reason != ENDPOINT_GONE:
        deps.metrics.turn_gap.observe(max(0.0, deps.config.conversation.ttl_seconds - entry.remaining))


# ---- 2. prefill -----------------------------------------------------------------------------------------------------


async def prefill(deps: Deps, ctx: Context, decode_attempt: int) -> dict[str, Any] | None:
    """The prefill leg with its retries; returns prefill's kv_transfer_params (None: decode recomputes)."""
    turn, cfg, metrics = ctx.turn, deps.config, deps.metrics
    pool = deps.engines.prefill
    failures: list[LegFailure] = []
    tried: set[str] = set()
    replay_failed = False
    current: attempts.PrefillAttempt | None = attempts.first_prefill(decode_attempt, ctx.decision.hit)
    while current is not None:
        reads = ctx.decision.tokens if current.replay else 0
        hints = Hints(frozenset(tried), ctx.decision.previous_prefill, reads, ctx.revision)
        engine = deps.pickers[PREFILL].pick(pool, hints)
        if engine is None:
            break
        tried.add(engine.url)
        kv = ctx.decision.params if current.replay and ctx.decision.params is not None else protocol.miss_params()
        body = turn.encode(protocol.prefill_leg_body(turn.body, kv, turn.api.legs))
        suffix = (f"-d{decode_attempt}" if decode_attempt else "") + (f"-p{current.number}" if current.number else "")
        reused = ctx.decision.tokens if current.replay else 0
        leg = None
        if ctx.trace is not None:
            leg = ctx.trace.prefill(engine.url, current.number, decode_attempt, current.replay, reused)
        headers = legs.leg_headers(turn.request_id + suffix, deps.engine_api_key, leg.headers if leg else None)
        expected = deps.leg_costs.leg_seconds(len(body), reused) if deps.leg_costs is not None else 0.0
        # Only a leg that had its engine to itself measures the engine: one that shared it measures the queue too.
        alone = engine.inflight == 0
        started = time.perf_counter()
        try:
            with pool.busy(engine, expected):
                reply, resent = await deps.client.prefill(
                    engine.url, turn.path, body, headers, cfg.timeouts, replay=current.replay
                )
                alone = alone and engine.inflight == 1
        except LegFailure as failure:
            if leg is not None:
                leg.failed(failure)
            metrics.backend_errors.labels(PREFILL, failure.kind).inc()
            failures.append(failure)
            log.warning(
                "request %s: prefill leg on %s failed%s: %s",
                turn.request_id,
                engine.url,
                " while replaying decode's blocks" if current.replay else "",
                failure.detail,
            )
            if failure.kind == CONNECT:
                pool.mark(engine, False, failure.detail)
            if current.replay:
                metrics.miss("prefill_retry")
                ctx.miss_reason = "prefill_retry"
                replay_failed = True
            current = attempts.next_prefill(current, failure.kind, replay_failed, cfg.prefill_retries)
            if current is not None:
                metrics.retries.labels(PREFILL).inc()
            continue
        except BaseException as exc:
            if leg is not None:
                leg.abandoned(exc)
            raise
        if leg is not None:
            leg.ok()
        ctx.prefill_url = engine.url
        ctx.prefill_seconds = time.perf_counter() - started
        if resent:
            metrics.resends.labels(PREFILL).inc()
        metrics.leg_duration.labels(PREFILL).observe(ctx.prefill_seconds)
        if deps.calibration is not None and alone:
            deps.calibration.observe(reply.get("usage"), reused, ctx.prefill_seconds)
        if deps.leg_costs is not None:
            deps.leg_costs.observe(len(body), reply.get("usage"))
        read_back = ctx.decision.tokens if current.replay else 0
        counted = tokens_of(reply.get("usage"))
        if counted is not None:
            prompt = counted[0]
            metrics.prompt_tokens.labels("read_back").inc(min(read_back, prompt))
            metrics.prompt_tokens.labels("computed").inc(max(0, prompt - read_back))
        if current.replay:
            ctx.replayed = True
            if deps.fabric is not None and ctx.decision.sticky_decode:
                deps.fabric.note_read(engine.url, ctx.decision.sticky_decode)
            metrics.reuse_hits.inc()
            metrics.reused_tokens.inc(ctx.decision.tokens)
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
    raise leg_error(PREFILL, failures)


# ---- 3. decode ------------------------------------------------------------------------------------------------------


async def decode(deps: Deps, ctx: Context, engine: Engine, attempt: int, prefill_params: dict[str, Any] | None) -> None:
    """Open the decode leg on `engine` and relay its answer (4.), which records the turn (5.). LegFailure when the
    leg failed before the client saw a byte."""
    turn = ctx.turn
    pool = deps.engines.decode
    body = turn.encode(protocol.decode_leg_body(turn.body, prefill_params))
    if deps.fabric is not None and prefill_params and ctx.prefill_url:
        deps.fabric.note_read(engine.url, ctx.prefill_url)  # decode reads prefill's blocks (P->D)
    leg = ctx.decode_leg = ctx.trace.decode(engine.url, attempt) if ctx.trace is not None else None
    headers = legs.leg_headers(
        turn.request_id + (f"-d{attempt}" if attempt else ""), deps.engine_api_key, leg.headers if leg else None
    )
    started = ctx.decode_started = time.perf_counter()
    try:
        with pool.busy(engine):
            answer = await deps.client.open_decode(engine.url, turn.path, body, headers, deps.config.timeouts)
            if answer.resent:
                deps.metrics.resends.labels(DECODE).inc()
            deps.metrics.leg_duration.labels(DECODE).observe(time.perf_counter() - started)
            # The relay gives the connection back when it is done with the response. Anything else closes it:
            # dropping the connection makes the engine abort the request.
            try:
                if turn.stream:
                    await relay_stream(deps, ctx, engine, answer)
                else:
                    await relay_body(deps, ctx, engine, answer)
            except BaseException:
                answer.close()
                raise
    except LegFailure as failure:
        if leg is not None:
            leg.failed(failure)
        raise
    except BaseException as exc:
        if leg is not None:
            leg.abandoned(exc)
        raise
    if leg is not None:
        leg.ok()


def decode_failed(deps: Deps, turn: Turn, engine: Engine, failure: LegFailure) -> LegFailure:
    deps.metrics.backend_errors.labels(DECODE, failure.kind).inc()
    log.warning("request %s: decode leg on %s failed: %s", turn.request_id, engine.url, failure.detail)
    if failure.kind == CONNECT:
        deps.engines.decode.mark(engine, False, failure.detail)
    return failure


# ---- 4. relay -------------------------------------------------------------------------------------------------------


async def relay_body(deps: Deps, ctx: Context, engine: Engine, answer: legs.DecodeAnswer) -> None:
    turn, exchange = ctx.turn, ctx.exchange
    raw = await answer.read_body(deps.config.timeouts.decode_idle_seconds)
    body, exact = legs.json_reply(raw, "decode")
    kv_params = protocol.pop_kv_params(body)
    # A reply only the lenient parser could read (NaN, ...) is relayed but not compared: a tombstone is stored.
    reply = turn.api.reply_of_body(body) if exact else Reply(choices=0)
    out = jsonio.dumps(body, exact)

    def respond() -> None:
        exchange.respond(200, out, headers={"X-Request-Id": turn.request_id, **ctx.receipt()})
        elapsed = time.perf_counter() - turn.started
        deps.metrics.ttft.labels(turn.route, "false", ctx.reuse_label).observe(elapsed, ctx.exemplar())
        deps.metrics.e2e.labels(turn.route, "false").observe(elapsed)

    await answer_and_record(deps, ctx, engine, kv_params, reply, respond)


async def relay_stream(deps: Deps, ctx: Context, engine: Engine, answer: legs.DecodeAnswer) -> None:
    reader = answer.reader(deps.config.timeouts.decode_idle_seconds)
    relay = StreamRelay(ctx.turn.api.collector() if ctx.turn.keying else None, ctx.turn.api.stream)
    try:
        await _relay_events(deps, ctx, engine, reader, relay)
    finally:
        reader.close()
    # The end of decode's chunked body usually comes just after [DONE]: the connection then goes back to the pool for
    # the next leg, without holding up this handler (the client has its answer already).
    reader.finish(_END_OF_BODY_SECONDS if relay.finished else 0)


async def _relay_events(deps: Deps, ctx: Context, engine: Engine, reader: legs.ChunkReader, relay: StreamRelay) -> None:
    exchange = ctx.exchange
    parser = SSEParser()
    try:
        # Whatever arrived since the last read goes out in one write.
        while chunk := await reader.read():
            batch: bytes | bytearray | None = relay.take_plain(parser, chunk)
            if batch is None:
                batch = relay.take(parser.feed(chunk))
            if batch:
                _send(deps, ctx, batch)
                await exchange.drain()
            if relay.finished:
                break
        else:
            batch = relay.take(parser.close())  # an unterminated last event still counts
            if batch:
                _send(deps, ctx, batch)
    except LegFailure as failure:
        if not exchange.started:
            raise
        decode_failed(deps, ctx.turn, engine, failure)
        return _end_stream_with_error(deps, ctx, "The decode engine's stream broke off.")
    except ValueError as exc:  # an event beyond the parser's size limit
        if not exchange.started:
            raise LegFailure(BROKEN, str(exc)) from exc
        decode_failed(deps, ctx.turn, engine, LegFailure(BROKEN, str(exc)))
        return _end_stream_with_error(deps, ctx, "The decode engine's stream was malformed.")
    if not relay.finished:
        if not exchange.started:
            raise LegFailure(BROKEN, "decode stream ended without data")
        decode_failed(deps, ctx.turn, engine, LegFailure(BROKEN, "decode stream ended without [DONE]"))
        return _end_stream_with_error(deps, ctx, "The decode engine's stream ended unexpectedly.")
    if relay.collector is not None:
        reply = relay.collector.reply()
        await answer_and_record(
            deps, ctx, engine, relay.kv_params, reply, lambda: _send(deps, ctx, relay.held, last=True)
        )
    else:
        _send(deps, ctx, relay.held, last=True)
    deps.metrics.e2e.labels(ctx.turn.route, "true").observe(time.perf_counter() - ctx.turn.started)


def _send(deps: Deps, ctx: Context, data: bytes | bytearray, last: bool = False) -> None:
    """Data to the client, starting the response with it first; `last` ends it in the same write."""
    exchange, turn = ctx.exchange, ctx.turn
    if not exchange.started:
        headers = {
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            "X-Request-Id": turn.request_id,
            **ctx.receipt(),
        }
        exchange.start(200, headers, data)
        ttft = time.perf_counter() - turn.started
        deps.metrics.ttft.labels(turn.route, "true", ctx.reuse_label).observe(ttft, ctx.exemplar())
        data = b""
    if last:
        exchange.end(data)
    else:
        exchange.write(data)


def _end_stream_with_error(deps: Deps, ctx: Context, message: str) -> None:
    deps.metrics.e2e.labels(ctx.turn.route, "true").observe(time.perf_counter() - ctx.turn.started)
    if ctx.decode_leg is not None:
        ctx.decode_leg.broke(message)
    ctx.exchange.write(ctx.turn.api.stream.error(message))
    ctx.exchange.end()


# ---- 5. record ------------------------------------------------------------------------------------------------------


async def answer_and_record(
    deps: Deps, ctx: Context, engine: Engine, kv_params: Any, reply: Reply, answer: Callable[[], None]
) -> None:
    """Send the client the end of its answer and store what decode retained, in the order that lets the client's
    next turn always find the entry (see 5. above)."""
    if ctx.turn.keying is None or deps.store.immediate:
        try:
            answer()
        finally:
            await record(deps, ctx.turn, engine, kv_params, reply, ctx.prefill_url)
    else:
        await record(deps, ctx.turn, engine, kv_params, reply, ctx.prefill_url)
        answer()


async def record(
    deps: Deps, turn: Turn, engine: Engine, kv_params: Any, reply: Reply, prefill_url: str | None = None
) -> None:
    """Store the turn's capture; recording is an optimisation and never costs the client its answer. A draining
    decode engine binds nothing while another serves (its hook waits for what it holds); when it is the last one (a
    single decode replaced), it binds as any engine would, and the conversation moves once a replacement serves."""
    outcome = "not_stored"
    try:
        draining = engine.draining and not deps.engines.decode.only_draining_left()
        capture = reuse.after_decode(turn, engine.url, kv_params, reply, prefill_url, draining)
        outcome = capture.outcome
        if capture.why is not None:
            log.debug("request %s: not storing decode's blocks: %s", turn.request_id, capture.why)
        if capture.entry is not None and capture.key is not None:
            evicted = await deps.store.put(capture.key, capture.entry, deps.config.conversation.ttl_seconds)
            if evicted:
                deps.metrics.store_dropped.inc(evicted)
            observe_store_bytes(deps)
    except StoreError:
        deps.metrics.store_errors.labels("put").inc()
        outcome = "store_error"
    except Exception:
        log.exception("request %s: recording decode's blocks failed", turn.request_id)
        outcome = "not_stored"
    engine.saw_params(turn.stream, kv_params is not None)
    deps.metrics.captures.labels(outcome, "true" if turn.stream else "false", engine.url).inc()


def observe_store_bytes(deps: Deps) -> None:
    held = deps.store.bytes_held()
    if held is not None:
        deps.metrics.store_bytes.set(held)


# ---- errors ---------------------------------------------------------------------------------------------------------


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


# What a client reads of a leg's failure: its kind, never its detail, which can name an engine's address (a connect
# error's "Cannot connect to host 198.18.0.7:8000") or its software. The detail goes to the log and the engine's health.
CLIENT_REASONS = {
    CONNECT: "unreachable",
    TIMEOUT: "timed out",
    STATUS_5XX: "server error",
    BROKEN: "connection lost or reply unreadable",
}


def leg_error(leg: str, failures: list[LegFailure]) -> RouterError:
    """The client's error after a leg gave up."""
    last = failures[-1]
    if last.kind == STATUS_4XX:
        return EngineError(last)
    if all(f.kind == CONNECT for f in failures):
        return BackendUnavailable(f"No {leg} engine could be reached.")
    if last.kind == TIMEOUT:
        return RouterError(f"The {leg} engine timed out.", status=504, type="timeout")
    reason = f"HTTP {last.status}" if last.status else CLIENT_REASONS.get(last.kind, "error")
    return BackendFailed(f"The {leg} engine failed ({reason}).")

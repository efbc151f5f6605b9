"""OpenTelemetry traces of the requests the router serves (config `tracing`), exported over OTLP/HTTP.

Each completion is one trace, or one subtree of its client's trace when the client sent a W3C `traceparent`:

    duplex.request   SERVER  the request, from its head to the end of its answer: API, stream, model, HTTP status,
                             the reuse verdict (hit or miss), the miss reason and the tokens read back from decode
      duplex.prefill CLIENT  one per prefill attempt: engine (server.address/port), attempt, whether it replays
                             decode's blocks
      duplex.decode  CLIENT  one per decode attempt, until the end of the relayed answer

Each leg carries the `traceparent` of its own span, so an engine that exports spans (vLLM with
--otlp-traces-endpoint, the simulator likewise) hangs its request span under the leg that sent it. Traces go to the
operator's collector, never to clients: naming engines in them is fine, and no tenant or conversation id is recorded.

What it costs is the SDK's: about 25 us of CPU per span to create and end, as much again to export (in its own
thread, but the same interpreter): so three spans a request, each attribute set once, and a request the sampler
leaves out gets one unrecorded span and none for its legs (bench/results/history/router-tracing-2026-12-04.md). This module is imported only when tracing is on
(live.tracer_of): with it off the router never loads OpenTelemetry, and the request path's only cost is testing
`Deps.tracer` (and `Context.trace`) for None.
"""

from __future__ import annotations

import functools
import urllib.parse
from collections.abc import Mapping
from typing import TYPE_CHECKING

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider, sampling
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from duplex_sidecars.router.config import TracingConfig, traces_url

if TYPE_CHECKING:
    from duplex_sidecars.router.exchange import Exchange
    from duplex_sidecars.router.legs import LegFailure
    from duplex_sidecars.router.turn import Turn

SCOPE = "duplex.router"
REQUEST, PREFILL, DECODE = "duplex.request", "duplex.prefill", "duplex.decode"

# Attributes: OpenTelemetry's semantic conventions where they have one, duplex.* for the rest.
HTTP_STATUS = "http.response.status_code"
SERVER_ADDRESS = "server.address"
SERVER_PORT = "server.port"
ERROR_TYPE = "error.type"
MODEL = "gen_ai.request.model"
API = "duplex.api"  # the route's name: chat, completions, responses, messages
STREAM = "duplex.stream"
REQUEST_ID = "duplex.request_id"  # the X-Request-Id the legs carry (engines put it in their own request ids)
REUSE = "duplex.reuse"  # hit | miss
MISS_REASON = "duplex.reuse.miss_reason"
TOKENS_READ_BACK = "duplex.reuse.tokens_read_back"  # prompt tokens prefill read from decode instead of computing
ATTEMPT = "duplex.attempt"  # 0 the first try of this leg, then 1, 2, ...
DECODE_ATTEMPT = "duplex.decode_attempt"  # prefill: the decode attempt it prefills for
REPLAY = "duplex.replay"  # prefill: the leg carries decode's blocks
REPLAY_TOKENS = "duplex.replay.tokens"  # prefill: the tokens those blocks hold

EXPORT_TIMEOUT_SECONDS = 5.0  # one export, retries included; bounds the router's shutdown when the collector is gone
SHUTDOWN_MILLIS = 10_000

_PROPAGATOR = TraceContextTextMapPropagator()


@functools.lru_cache(maxsize=1024)
def _address(url: str) -> tuple[str, int]:
    parts = urllib.parse.urlsplit(url)
    return parts.hostname or url, parts.port or (443 if parts.scheme == "https" else 80)


class RouterTracer:
    """The router's tracer provider: a parent-based ratio sampler, a batch span processor (its own thread exports,
    never the event loop) and an exporter, OTLP/HTTP to `config.endpoint` unless one is given (tests). Not the global
    provider: it belongs to one config generation, and `shutdown` flushes it."""

    def __init__(self, config: TracingConfig, exporter: SpanExporter | None = None):
        if exporter is None:
            assert config.endpoint is not None, "tracing is off"
            exporter = OTLPSpanExporter(endpoint=traces_url(config.endpoint), timeout=EXPORT_TIMEOUT_SECONDS)
        self.config = config
        self._provider = TracerProvider(
            sampler=sampling.ParentBased(sampling.TraceIdRatioBased(config.sample_ratio)),
            resource=Resource.create({"service.name": config.service_name}),
            shutdown_on_exit=False,  # the router shuts it down itself, with a bounded wait
        )
        self._processor = BatchSpanProcessor(exporter)
        self._provider.add_span_processor(self._processor)
        self._tracer = self._provider.get_tracer(SCOPE)

    def request(self, exchange: Exchange, api: str) -> RequestTrace:
        """The span of a request just read, under the client's trace when it sent a valid traceparent."""
        parent = None
        traceparent = exchange.header("traceparent")
        if traceparent:
            carrier = {"traceparent": traceparent}
            tracestate = exchange.header("tracestate")
            if tracestate:
                carrier["tracestate"] = tracestate
            parent = _PROPAGATOR.extract(carrier)
        span = self._tracer.start_span(REQUEST, context=parent, kind=SpanKind.SERVER)
        return RequestTrace(self._tracer, span, api)

    def force_flush(self) -> bool:
        return self._processor.force_flush()

    def shutdown(self) -> None:
        """Export what is queued and stop (blocking: call it off the event loop). Spans that end later are dropped."""
        # The span processor's own shutdown waits up to 30 s for its thread; its batch processor takes a bound.
        self._processor._batch_processor.shutdown(timeout_millis=SHUTDOWN_MILLIS)
        self._provider.shutdown()


class RequestTrace:
    """One request's span and its legs' spans. Its attributes are gathered as the request goes and set in one call
    when it ends. A request the sampler left out records nothing: its legs get no span of their own, only the
    request's unsampled trace context to pass on, so that the engines do not sample it either."""

    __slots__ = ("_context", "_legs_headers", "_tracer", "attributes", "span")

    def __init__(self, tracer: trace.Tracer, span: Span, api: str):
        self._tracer = tracer
        self.span = span
        self.attributes: dict[str, str | bool | int] = {API: api}
        if span.is_recording():
            self._context = trace.set_span_in_context(span)
            self._legs_headers = None
        else:
            self._legs_headers = _trace_headers(span)

    def exemplar(self) -> dict[str, str] | None:
        """The request's trace id as a metrics exemplar (`trace_id`, as Grafana links it to the trace), when the
        request is sampled; None otherwise."""
        if self._legs_headers is not None:
            return None
        return {"trace_id": f"{self.span.get_span_context().trace_id:032x}"}

    def parsed(self, turn: Turn) -> None:
        self.attributes.update({STREAM: turn.stream, MODEL: turn.model, REQUEST_ID: turn.request_id})

    def prefill(self, url: str, attempt: int, decode_attempt: int, replay: bool, tokens: int) -> LegTrace:
        """A prefill attempt to the engine at `url`, replaying decode's blocks (`tokens` of them) or not."""
        if self._legs_headers is not None:
            return LegTrace(None, self._legs_headers)
        attributes = self._leg_attributes(url, attempt)
        attributes[REPLAY] = replay
        if replay:
            attributes[REPLAY_TOKENS] = tokens
        if decode_attempt:
            attributes[DECODE_ATTEMPT] = decode_attempt
        return self._leg(PREFILL, attributes)

    def decode(self, url: str, attempt: int) -> LegTrace:
        if self._legs_headers is not None:
            return LegTrace(None, self._legs_headers)
        return self._leg(DECODE, self._leg_attributes(url, attempt))

    def _leg_attributes(self, url: str, attempt: int) -> dict[str, str | bool | int]:
        host, port = _address(url)
        return {SERVER_ADDRESS: host, SERVER_PORT: port, ATTEMPT: attempt}

    def _leg(self, name: str, attributes: dict[str, str | bool | int]) -> LegTrace:
        """A leg attempt's span, and the headers that carry it to the engine."""
        span = self._tracer.start_span(name, context=self._context, kind=SpanKind.CLIENT, attributes=attributes)
        return LegTrace(span, _trace_headers(span))

    def verdict(self, replayed: bool, miss_reason: str | None, tokens: int) -> None:
        """What the request's prefill did in the end: read decode's blocks back (hit) or computed (miss, and why)."""
        if replayed:
            self.attributes.update({REUSE: "hit", TOKENS_READ_BACK: tokens})
        else:
            self.attributes.update({REUSE: "miss", MISS_REASON: miss_reason or "no_entry", TOKENS_READ_BACK: 0})

    def end(self, status: int) -> None:
        attributes = self.attributes
        attributes[HTTP_STATUS] = status
        if status >= 500:
            attributes[ERROR_TYPE] = str(status)
            self.span.set_status(Status(StatusCode.ERROR))
        self.span.set_attributes(attributes)
        self.span.end()


def _trace_headers(span: Span) -> Mapping[str, str]:
    """The W3C trace context (https://www.w3.org/TR/trace-context/) naming `span` as the parent: version 00, trace
    id, span id, flags; and the trace state it came with."""
    ctx = span.get_span_context()
    headers = {"traceparent": f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{ctx.trace_flags:02x}"}
    if ctx.trace_state:
        headers["tracestate"] = ctx.trace_state.to_header()
    return headers


class LegTrace:
    """One leg attempt's span (None: the request is not sampled) and the headers that carry it to the engine; the
    first of ok, failed, broke and abandoned ends the span, the others then do nothing."""

    __slots__ = ("headers", "span")

    def __init__(self, span: Span | None, headers: Mapping[str, str]):
        self.span = span
        self.headers = headers

    def ok(self) -> None:
        if self.span is not None:
            self.span.set_attribute(HTTP_STATUS, 200)
            self._end()

    def failed(self, failure: LegFailure) -> None:
        """The leg failed before the client saw a byte of it (another attempt may follow)."""
        if self.span is not None:
            if failure.status is not None:
                self.span.set_attribute(HTTP_STATUS, failure.status)
            self._end(failure.kind, failure.detail)

    def broke(self, message: str) -> None:
        """Decode's stream broke off after the client had its first bytes (the answer ends with an error event)."""
        if self.span is not None:
            self.span.set_attribute(HTTP_STATUS, 200)
            self._end("stream_broken", message)

    def abandoned(self, exc: BaseException) -> None:
        """The request ended under the leg (client gone, cancelled, a bug)."""
        if self.span is not None:
            self._end(type(exc).__name__, str(exc) or None)

    def _end(self, error: str | None = None, detail: str | None = None) -> None:
        assert self.span is not None
        if error is not None:
            self.span.set_attributes({ERROR_TYPE: error})
            self.span.set_status(Status(StatusCode.ERROR, detail))
        self.span.end()
        self.span = None

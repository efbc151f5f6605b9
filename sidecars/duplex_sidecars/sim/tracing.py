"""The simulator's spans, as vLLM exports them with --otlp-traces-endpoint, so that a router's traces look the same
over simulated and real engines.

  llm_request  SERVER  one per request, parented by the request's W3C `traceparent` (the router's leg span), from its
                       arrival to its end, with vLLM 0.33's attributes (vllm/tracing/utils.py SpanAttributes, set by
                       OutputProcessor.do_tracing): gen_ai.request.id, gen_ai.usage.prompt_tokens and
                       completion_tokens, gen_ai.request.max_tokens, gen_ai.latency.time_to_first_token, e2e,
                       time_in_queue (here: the wait for the simulator's one compute slot), time_in_model_prefill,
                       time_in_model_decode and time_in_model_inference.
    kv_read    INTERNAL  the simulator's own (vLLM traces no KV transfer): one READ of a remote engine's blocks over
                       NIXL, prefill reading decode's (direction decode_to_prefill, a replayed turn) or decode reading
                       prefill's (prefill_to_decode): the remote engine and side channel, blocks, tokens, bytes and
                       the outcome (ok, or the failed load's reason).

Where vLLM differs: it exports a span only for a request that finishes (an aborted one has none), where the simulator
ends an aborted request's span with an error status, so that its kv_read child is not left without a parent.

Exported as vLLM does: a batch span processor, the OTLP exporter of OTEL_EXPORTER_OTLP_TRACES_PROTOCOL (vLLM's
default, grpc, or http/protobuf) given the endpoint verbatim (http/protobuf: the full URL,
http://collector:4318/v1/traces), service.name from OTEL_SERVICE_NAME. Imported only when tracing is on.
"""

from __future__ import annotations

import importlib.util
import os
import time
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

if TYPE_CHECKING:
    from duplex_sidecars.sim.engine import GenerationRequest, Running

# vLLM's names (vllm/tracing/utils.py, vllm/v1/engine/output_processor.py, vllm/tracing/otel.py).
REQUEST_SPAN = "llm_request"
SCOPE = "vllm.llm_engine"
GEN_AI_REQUEST_ID = "gen_ai.request.id"
GEN_AI_REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
GEN_AI_USAGE_PROMPT_TOKENS = "gen_ai.usage.prompt_tokens"
GEN_AI_USAGE_COMPLETION_TOKENS = "gen_ai.usage.completion_tokens"
GEN_AI_LATENCY_TIME_TO_FIRST_TOKEN = "gen_ai.latency.time_to_first_token"
GEN_AI_LATENCY_E2E = "gen_ai.latency.e2e"
GEN_AI_LATENCY_TIME_IN_QUEUE = "gen_ai.latency.time_in_queue"
GEN_AI_LATENCY_TIME_IN_MODEL_PREFILL = "gen_ai.latency.time_in_model_prefill"
GEN_AI_LATENCY_TIME_IN_MODEL_DECODE = "gen_ai.latency.time_in_model_decode"
GEN_AI_LATENCY_TIME_IN_MODEL_INFERENCE = "gen_ai.latency.time_in_model_inference"

# The simulator's own.
KV_READ_SPAN = "kv_read"
KV_DIRECTION = "duplex.kv.direction"  # decode_to_prefill (a replayed turn) | prefill_to_decode
KV_REMOTE_ENGINE = "duplex.kv.remote_engine_id"
KV_BLOCKS = "duplex.kv.blocks"
KV_TOKENS = "duplex.kv.tokens"
KV_BYTES = "duplex.kv.bytes"
KV_OUTCOME = "duplex.kv.outcome"  # ok | the failed load's reason (expired, transfer_error, corrupt, ...)
SERVER_ADDRESS = "server.address"
SERVER_PORT = "server.port"
ERROR_TYPE = "error.type"

PROTOCOLS = ("grpc", "http/protobuf")
PROTOCOL_ENV = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"  # what vLLM reads to pick its exporter
_PROPAGATOR = TraceContextTextMapPropagator()


class TracingUnavailable(RuntimeError):
    pass


def check_protocol(protocol: str) -> None:
    """TracingUnavailable unless the simulator can export over `protocol`."""
    if protocol not in PROTOCOLS:
        raise TracingUnavailable(f"unsupported OTLP protocol {protocol!r}: expected one of {', '.join(PROTOCOLS)}")
    if protocol == "grpc" and not _importable("opentelemetry.exporter.otlp.proto.grpc"):
        raise TracingUnavailable(
            "OTLP over gRPC (vLLM's default protocol) needs opentelemetry-exporter-otlp-proto-grpc, which the "
            f"simulator does not ship: set {PROTOCOL_ENV}=http/protobuf and give the OTLP/HTTP traces URL "
            "(http://collector:4318/v1/traces), which vLLM takes as well"
        )


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


def exporter_for(endpoint: str, protocol: str) -> SpanExporter:
    """vLLM's get_span_exporter: gRPC (insecure) or OTLP/HTTP, the endpoint as given."""
    check_protocol(protocol)
    if protocol == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter(endpoint=endpoint)
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (  # type: ignore[import-not-found]
        OTLPSpanExporter as GrpcExporter,
    )

    exporter: SpanExporter = GrpcExporter(endpoint=endpoint, insecure=True)
    return exporter


class EngineTracer:
    """One engine's tracer provider (vLLM's init_otel_tracer)."""

    def __init__(self, endpoint: str, protocol: str, engine_id: str, role: str, exporter: SpanExporter | None = None):
        resource = Resource.create(
            {
                "vllm.instrumenting_module_name": SCOPE,
                "vllm.process_id": str(os.getpid()),
                "duplex.sim.engine_id": engine_id,
                "duplex.sim.role": role,
            }
        )
        self._provider = TracerProvider(resource=resource, shutdown_on_exit=False)
        self._provider.add_span_processor(BatchSpanProcessor(exporter or exporter_for(endpoint, protocol)))
        self._tracer = self._provider.get_tracer(SCOPE)

    def request(self, req: GenerationRequest) -> RequestSpan:
        parent = _PROPAGATOR.extract(req.trace_headers) if req.trace_headers else None
        span = self._tracer.start_span(REQUEST_SPAN, context=parent, kind=SpanKind.SERVER)
        return RequestSpan(self._tracer, span, req)

    def force_flush(self) -> bool:
        return self._provider.force_flush()

    def shutdown(self) -> None:
        self._provider.shutdown()


class RequestSpan:
    """One request's llm_request span, ended with vLLM's attributes once the request is done."""

    def __init__(self, tracer: trace.Tracer, span: Span, req: GenerationRequest):
        self._tracer = tracer
        self.span = span
        self.req = req
        self.arrived = time.perf_counter()
        self.done = False

    def kv_read(self, p_node: bool, params: dict[str, Any], tokens: int) -> KVRead:
        port = params.get("remote_port")
        span = self._tracer.start_span(
            KV_READ_SPAN,
            context=trace.set_span_in_context(self.span),
            attributes={
                KV_DIRECTION: "decode_to_prefill" if p_node else "prefill_to_decode",
                KV_REMOTE_ENGINE: str(params.get("remote_engine_id")),
                KV_TOKENS: tokens,
                SERVER_ADDRESS: str(params.get("remote_host")),
                **({SERVER_PORT: port} if isinstance(port, int) and not isinstance(port, bool) else {}),
            },
        )
        return KVRead(span)

    def finish(self, run: Running) -> None:
        """The request's end (finished or aborted): vLLM's attributes from what it went through."""
        if self.done:
            return
        self.done = True
        now = time.perf_counter()
        first = run.first_token_at
        attributes: dict[str, Any] = {
            GEN_AI_REQUEST_ID: self.req.request_id.rsplit("-", 1)[0],  # the id before the engine's random suffix
            GEN_AI_USAGE_PROMPT_TOKENS: len(self.req.prompt),
            GEN_AI_USAGE_COMPLETION_TOKENS: len(run.output),
            GEN_AI_LATENCY_E2E: now - self.arrived,
            GEN_AI_LATENCY_TIME_IN_QUEUE: run.queued_seconds,
        }
        if self.req.max_tokens:
            attributes[GEN_AI_REQUEST_MAX_TOKENS] = self.req.max_tokens
        if first is not None:
            scheduled = self.arrived + run.queued_seconds
            attributes[GEN_AI_LATENCY_TIME_TO_FIRST_TOKEN] = first - self.arrived
            attributes[GEN_AI_LATENCY_TIME_IN_MODEL_PREFILL] = first - scheduled
            attributes[GEN_AI_LATENCY_TIME_IN_MODEL_DECODE] = now - first
            attributes[GEN_AI_LATENCY_TIME_IN_MODEL_INFERENCE] = now - scheduled
        self.span.set_attributes(attributes)
        if not run.completed:
            self.span.set_attribute(ERROR_TYPE, "aborted")
            self.span.set_status(Status(StatusCode.ERROR, "aborted before it finished"))
        self.span.end()

    def failed(self, exc: BaseException) -> None:
        """The request failed before its first token (a failed KV load, no free blocks)."""
        if self.done:
            return
        self.done = True
        self.span.set_attributes(
            {
                GEN_AI_REQUEST_ID: self.req.request_id.rsplit("-", 1)[0],
                GEN_AI_USAGE_PROMPT_TOKENS: len(self.req.prompt),
                GEN_AI_LATENCY_E2E: time.perf_counter() - self.arrived,
                ERROR_TYPE: type(exc).__name__,
            }
        )
        self.span.set_status(Status(StatusCode.ERROR, str(exc)))
        self.span.end()


class KVRead:
    """One READ of remote blocks; `done` or `failed` says how it went, `end` ends it."""

    def __init__(self, span: Span):
        self.span = span
        self.outcome: str | None = None

    def done(self, blocks: int, nbytes: int) -> None:
        self.outcome = "ok"
        self.span.set_attributes({KV_BLOCKS: blocks, KV_BYTES: nbytes, KV_OUTCOME: "ok"})

    def failed(self, reason: str, detail: str) -> None:
        self.outcome = reason
        self.span.set_attributes({KV_OUTCOME: reason, ERROR_TYPE: reason})
        self.span.set_status(Status(StatusCode.ERROR, detail or reason))

    def end(self, exc: BaseException | None = None) -> None:
        if self.outcome is None and exc is not None:
            self.failed(type(exc).__name__, str(exc))
        self.span.end()

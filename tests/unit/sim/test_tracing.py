"""The simulator's spans (sim/tracing.py), as vLLM exports them with --otlp-traces-endpoint, into the SDK's in-memory
exporter: one llm_request SERVER span per request under the traceparent it came with, vLLM's gen_ai.* attributes, and
a kv_read child for each read of remote blocks: decode reading prefill's, and prefill reading decode's on a replayed
turn. Two engines in this process exchange blocks over real NIXL (UCX), as the integration tier's do across processes;
the router and a real Jaeger: tests/integration/test_traces.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from duplex_dev.processes import free_port
from duplex_sidecars import protocol
from duplex_sidecars.sim import tracing
from duplex_sidecars.sim.cli import config_from_args, parser
from duplex_sidecars.sim.config import SimConfig
from duplex_sidecars.sim.engine import Engine
from duplex_sidecars.sim.http_api import OpenAIApi
from duplex_sidecars.sim.side_channel import side_channel_app
from duplex_sidecars.sim.vllm_cli import translate

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
LONG = "Please summarise the following report in detail. " * 12  # well above the recompute threshold


@dataclass
class SimEngine:
    engine: Engine
    exporter: InMemorySpanExporter
    url: str

    def spans(self) -> list[ReadableSpan]:
        assert self.engine.tracer is not None
        self.engine.tracer.force_flush()
        return list(self.exporter.get_finished_spans())


async def _start(role: str, runners: list[web.AppRunner], **config: Any) -> SimEngine:
    port, side = free_port(), free_port()
    cfg = SimConfig(
        role=role,
        port=port,
        side_channel_port=side,
        engine_id=f"unit-{role}",
        kv_load_failure_policy="recompute",
        otlp_traces_endpoint="http://collector.invalid:4318/v1/traces",
        otlp_traces_protocol="http/protobuf",
        **config,
    )
    exporter = InMemorySpanExporter()
    engine = Engine(cfg, tracer=tracing.EngineTracer("unused", "http/protobuf", cfg.engine_id, role, exporter))
    await engine.start()
    for app, at in ((OpenAIApi(engine).app(), port), (side_channel_app(engine), side)):
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        runners.append(runner)
        await web.TCPSite(runner, "127.0.0.1", at).start()
    return SimEngine(engine, exporter, f"http://127.0.0.1:{port}")


@pytest.fixture
async def engines() -> AsyncIterator[tuple[SimEngine, SimEngine]]:
    runners: list[web.AppRunner] = []
    started: list[SimEngine] = []
    try:
        started.append(await _start("prefill", runners, enable_prefix_caching=False))
        started.append(await _start("decode", runners))
        yield started[0], started[1]
    finally:
        for runner in runners:
            await runner.cleanup()
        for sim in started:
            await sim.engine.stop()


async def post(session: aiohttp.ClientSession, url: str, body: dict[str, Any], span: str | None) -> dict[str, Any]:
    headers = {"X-Request-Id": "req-1"}
    if span is not None:
        headers["traceparent"] = f"00-{TRACE}-{span}-01"
    async with session.post(url + "/v1/chat/completions", json=body, headers=headers) as resp:
        assert resp.status == 200, await resp.text()
        out: dict[str, Any] = await resp.json()
        return out


def one(spans: list[ReadableSpan], name: str) -> ReadableSpan:
    found = [s for s in spans if s.name == name]
    assert len(found) == 1, [s.name for s in spans]
    return found[0]


def attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


async def test_each_request_is_an_llm_request_span_under_its_traceparent_with_its_kv_reads(engines):
    p, d = engines
    messages: list[dict[str, Any]] = [{"role": "user", "content": LONG}]
    async with aiohttp.ClientSession() as session:
        # Turn 1: prefill computes, decode reads prefill's blocks.
        body = {"model": "sim", "messages": messages, "max_tokens": 4}
        first = await post(session, p.url, protocol.prefill_leg_body(body, protocol.miss_params()), "00000000000000a1")
        answer = await post(
            session, d.url, protocol.decode_leg_body(body, first[protocol.KV_PARAMS_FIELD]), "00000000000000a2"
        )
        # Turn 2: prefill reads decode's blocks back (the replayed turn).
        messages += [answer["choices"][0]["message"], {"role": "user", "content": "And in one line?"}]
        stored = protocol.replayable_decode_params(answer[protocol.KV_PARAMS_FIELD])
        assert stored is not None
        body = {"model": "sim", "messages": messages, "max_tokens": 4}
        await post(session, p.url, protocol.prefill_leg_body(body, protocol.replay_params(stored)), "00000000000000b1")

    p_spans, d_spans = p.spans(), d.spans()
    p_requests = [s for s in p_spans if s.name == tracing.REQUEST_SPAN]
    assert len(p_requests) == 2
    for span, parent in zip(p_requests, ("00000000000000a1", "00000000000000b1"), strict=True):
        assert span.kind == SpanKind.SERVER
        assert f"{span.context.trace_id:032x}" == TRACE
        assert span.parent is not None and f"{span.parent.span_id:016x}" == parent
        a = attrs(span)
        assert a[tracing.GEN_AI_REQUEST_ID] == "chatcmpl-req-1"  # vLLM's external request id
        assert a[tracing.GEN_AI_USAGE_COMPLETION_TOKENS] == 1 and a[tracing.GEN_AI_REQUEST_MAX_TOKENS] == 1
        assert a[tracing.GEN_AI_USAGE_PROMPT_TOKENS] > 0
        for latency in (tracing.GEN_AI_LATENCY_E2E, tracing.GEN_AI_LATENCY_TIME_TO_FIRST_TOKEN):
            assert a[latency] >= 0
        assert span.status.status_code == StatusCode.UNSET
    # Prefill read decode's blocks on turn 2 only, under that turn's request span.
    (read_back,) = [s for s in p_spans if s.name == tracing.KV_READ_SPAN]
    assert read_back.parent is not None and read_back.parent.span_id == p_requests[1].context.span_id
    back = attrs(read_back)
    assert back[tracing.KV_DIRECTION] == "decode_to_prefill" and back[tracing.KV_OUTCOME] == "ok"
    assert back[tracing.KV_REMOTE_ENGINE] == "unit-decode"
    assert back[tracing.SERVER_PORT] == d.engine.cfg.side_channel_port
    assert back[tracing.KV_BLOCKS] > 0 and back[tracing.KV_BYTES] == back[tracing.KV_BLOCKS] * 4096
    assert back[tracing.KV_TOKENS] > 0
    # Decode read prefill's blocks under its own request span.
    d_request = one(d_spans, tracing.REQUEST_SPAN)
    assert f"{d_request.parent.span_id:016x}" == "00000000000000a2"  # type: ignore[union-attr]
    assert attrs(d_request)[tracing.GEN_AI_USAGE_COMPLETION_TOKENS] == 4
    read = one(d_spans, tracing.KV_READ_SPAN)
    assert read.parent is not None and read.parent.span_id == d_request.context.span_id
    assert attrs(read)[tracing.KV_DIRECTION] == "prefill_to_decode"
    assert attrs(read)[tracing.KV_REMOTE_ENGINE] == "unit-prefill"
    assert read.start_time >= d_request.start_time and read.end_time <= d_request.end_time  # type: ignore[operator]
    resource = dict(d_request.resource.attributes)
    assert resource["duplex.sim.engine_id"] == "unit-decode" and resource["vllm.instrumenting_module_name"]


async def test_a_request_without_traceparent_is_a_root_and_a_failed_read_is_an_error_child(engines):
    p, _ = engines
    body = {"model": "sim", "messages": [{"role": "user", "content": LONG}], "max_tokens": 4}
    params = {
        **protocol.miss_params(),
        "remote_engine_id": "gone",
        "remote_request_id": "r",
        "remote_block_ids": [[1, 2, 3, 4, 5, 6]],
        "remote_host": "127.0.0.1",
        "remote_port": free_port(),  # nothing listens: the side channel is unreachable
        "remote_num_tokens": 96,  # above the recompute threshold (64)
    }
    async with aiohttp.ClientSession() as session:
        await post(session, p.url, protocol.prefill_leg_body(body, params), None)  # recomputes
    spans = p.spans()
    request = one(spans, tracing.REQUEST_SPAN)
    assert request.parent is None
    read = one(spans, tracing.KV_READ_SPAN)
    assert read.parent is not None and read.parent.span_id == request.context.span_id
    assert read.status.status_code == StatusCode.ERROR
    assert attrs(read)[tracing.KV_OUTCOME] != "ok"


async def test_an_aborted_request_ends_its_span_in_error(engines):
    p, _ = engines
    body = {
        "model": "sim",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 20_000,
        "ignore_eos": True,
        "stream": True,
    }
    async with aiohttp.ClientSession() as session:
        resp = await session.post(p.url + "/v1/chat/completions", json=body)
        await resp.content.readline()
        resp.close()  # the client goes away mid-stream
    for _ in range(200):
        spans = [s for s in p.spans() if s.name == tracing.REQUEST_SPAN]
        if spans:
            break
        await asyncio.sleep(0.01)
    (span,) = spans
    assert span.status.status_code == StatusCode.ERROR
    assert attrs(span)[tracing.ERROR_TYPE] == "aborted"
    assert attrs(span)[tracing.GEN_AI_USAGE_COMPLETION_TOKENS] < 20_000


def test_without_the_flag_no_tracer(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", raising=False)
    cfg = config_from_args(parser().parse_args(["--role", "decode"]))
    assert cfg.otlp_traces_endpoint is None
    from duplex_sidecars.sim.engine import tracer_of

    assert tracer_of(cfg) is None


def test_the_protocol_is_vllms_and_grpc_is_refused_with_the_fix(monkeypatch: pytest.MonkeyPatch):
    url = "http://collector:4318/v1/traces"
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", raising=False)
    with pytest.raises(SystemExit, match="OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf"):
        config_from_args(parser().parse_args(["--role", "decode", "--otlp-traces-endpoint", url]))
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf")
    cfg = config_from_args(parser().parse_args(["--role", "decode", "--otlp-traces-endpoint", url]))
    assert (cfg.otlp_traces_endpoint, cfg.otlp_traces_protocol) == (url, "http/protobuf")


def test_vllm_serve_passes_the_endpoint_on():
    argv = [
        "serve",
        "m",
        "--otlp-traces-endpoint",
        "http://collector:4318/v1/traces",
        "--collect-detailed-traces",
        "all",
    ]
    args = translate(argv, {})
    assert args[args.index("--otlp-traces-endpoint") + 1] == "http://collector:4318/v1/traces"
    assert "--collect-detailed-traces" not in args

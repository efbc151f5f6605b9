"""The router's traces (router/tracing.py) into the OpenTelemetry SDK's in-memory exporter: the span tree of a miss and
of a hit turn, each leg's traceparent naming its own span, a client's trace continued, failed attempts as spans of
their own, sampling, reloads, and nothing at all when tracing is off. The same spans against a real Jaeger, with the
simulator's engine spans under them: tests/integration/test_traces.py."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from duplex_sidecars.router import tracing
from duplex_sidecars.router.app import Router, RouterServer
from duplex_sidecars.router.config import RouterConfig, TracingConfig
from duplex_sidecars.router.config_file import deep_merge

from .conftest import Rig
from .fake_engine import FakeEngine

ENDPOINT = "http://collector.invalid:4318"  # never reached: the exporter given to the router takes the spans
USER = {"role": "user", "content": "hi"}
CLIENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
CLIENT_SPAN = "b7ad6b7169203331"


class Traced:
    def __init__(self, rig: Rig, exporter: InMemorySpanExporter):
        self.rig = rig
        self.exporter = exporter

    async def spans(self, requests: int, timeout: float = 5.0) -> list[ReadableSpan]:
        """The finished spans once `requests` request spans are among them (a request's span ends just after the
        client has its answer)."""
        tracer = self.rig.router.live.deps.tracer
        assert tracer is not None
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            tracer.force_flush()
            spans = list(self.exporter.get_finished_spans())
            if sum(s.name == tracing.REQUEST for s in spans) >= requests:
                return spans
            assert asyncio.get_running_loop().time() < deadline, [s.name for s in spans]
            await asyncio.sleep(0.01)


TracedFactory = Callable[..., Awaitable[Traced]]


@pytest.fixture
async def make_traced() -> AsyncIterator[TracedFactory]:
    cleanups: list[Callable[[], Awaitable[None]]] = []

    async def factory(n_prefill: int = 1, n_decode: int = 1, **config: Any) -> Traced:
        prefill = [await FakeEngine(f"p{i}").start() for i in range(n_prefill)]
        decode = [await FakeEngine(f"d{i}").start() for i in range(n_decode)]
        for engine in prefill + decode:
            cleanups.append(engine.close)
        base = {
            "prefill": [e.url for e in prefill],
            "decode": [e.url for e in decode],
            "tracing": {"endpoint": ENDPOINT},
        }
        exporter = InMemorySpanExporter()
        router = Router(RouterConfig.model_validate(deep_merge(base, config)), span_exporter=exporter)
        server = RouterServer(router)
        await server.start()
        cleanups.append(server.close)
        session = aiohttp.ClientSession()
        cleanups.append(session.close)
        return Traced(Rig(router, server, prefill, decode, session), exporter)

    yield factory
    for cleanup in reversed(cleanups):
        await cleanup()


def hexid(value: int, width: int) -> str:
    return f"{value:0{width}x}"


def children(spans: list[ReadableSpan], parent: ReadableSpan) -> list[ReadableSpan]:
    assert parent.context is not None
    return [s for s in spans if s.parent is not None and s.parent.span_id == parent.context.span_id]


def traceparent_of(span: ReadableSpan) -> str:
    ctx = span.get_span_context()
    assert ctx is not None
    return f"00-{hexid(ctx.trace_id, 32)}-{hexid(ctx.span_id, 16)}-{hexid(ctx.trace_flags, 2)}"


@pytest.mark.parametrize("stream", [False, True])
async def test_a_miss_and_a_hit_turn_each_make_one_tree_and_each_leg_carries_its_own_span(make_traced, stream):
    traced = await make_traced()
    rig = traced.rig
    status, _, text = await rig.chat([USER], stream=stream)
    assert status == 200
    history = [USER, {"role": "assistant", "content": text}, {"role": "user", "content": "more"}]
    status, _, _ = await rig.chat(history, stream=stream)
    assert status == 200
    spans = await traced.spans(2)
    requests = [s for s in spans if s.name == tracing.REQUEST]
    assert len(requests) == 2
    for request, verdict, replay in zip(requests, ("miss", "hit"), (False, True), strict=True):
        assert request.kind == SpanKind.SERVER
        assert request.parent is None  # no client trace: a root
        attrs = dict(request.attributes or {})
        assert attrs[tracing.API] == "chat"
        assert attrs[tracing.STREAM] is stream
        assert attrs[tracing.HTTP_STATUS] == 200
        assert attrs[tracing.REUSE] == verdict
        under = children(spans, request)
        assert sorted(s.name for s in under) == sorted([tracing.PREFILL, tracing.DECODE])
        # Every span of the request is in its trace; the legs are its direct children, CLIENT spans to the engines.
        assert {s.context.trace_id for s in under} == {request.context.trace_id}
        legs = {s.name: s for s in under}
        prefill, decode = legs[tracing.PREFILL], legs[tracing.DECODE]
        assert prefill.kind == decode.kind == SpanKind.CLIENT
        assert dict(prefill.attributes or {})[tracing.REPLAY] is replay
        assert dict(prefill.attributes or {})[tracing.ATTEMPT] == 0
        for leg, engine in ((prefill, rig.p), (decode, rig.d)):
            leg_attrs = dict(leg.attributes or {})
            assert leg_attrs[tracing.SERVER_ADDRESS] == "127.0.0.1"
            assert engine.server is not None and leg_attrs[tracing.SERVER_PORT] == engine.server.port
            assert leg.status.status_code == StatusCode.UNSET
        # The engines were told the leg's own span: theirs hang under it.
        turn = requests.index(request)
        assert rig.p.seen[turn].headers["traceparent"] == traceparent_of(prefill)
        assert rig.d.seen[turn].headers["traceparent"] == traceparent_of(decode)
    miss, hit = (dict(r.attributes or {}) for r in requests)
    assert miss[tracing.MISS_REASON] == "no_entry" and miss[tracing.TOKENS_READ_BACK] == 0
    assert hit[tracing.TOKENS_READ_BACK] == 42 and tracing.MISS_REASON not in hit  # the fake decode's tokens
    assert requests[0].context.trace_id != requests[1].context.trace_id


async def test_a_client_traceparent_is_continued(make_traced):
    traced = await make_traced()
    headers = {"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01", "tracestate": "vendor=abc"}
    status, _, _ = await traced.rig.chat([USER], headers=headers)
    assert status == 200
    spans = await traced.spans(1)
    (request,) = [s for s in spans if s.name == tracing.REQUEST]
    assert hexid(request.context.trace_id, 32) == CLIENT_TRACE
    assert request.parent is not None and hexid(request.parent.span_id, 16) == CLIENT_SPAN
    assert request.parent.is_remote
    assert {hexid(s.context.trace_id, 32) for s in spans} == {CLIENT_TRACE}
    seen = traced.rig.p.seen[0].headers
    assert seen["traceparent"].startswith(f"00-{CLIENT_TRACE}-") and seen["tracestate"] == "vendor=abc"


async def test_a_malformed_client_traceparent_starts_a_trace_of_its_own(make_traced):
    traced = await make_traced()
    status, _, _ = await traced.rig.chat([USER], headers={"traceparent": "00-nonsense-01"})
    assert status == 200
    (request,) = [s for s in await traced.spans(1) if s.name == tracing.REQUEST]
    assert request.parent is None


async def test_each_failed_attempt_is_a_span_of_its_own(make_traced):
    traced = await make_traced(n_prefill=2)
    for engine in traced.rig.prefill:
        engine.actions.append(500)
    status, _, _ = await traced.rig.chat([USER])
    assert status == 502  # both prefill engines failed (one retry by default)
    spans = await traced.spans(1)
    prefills = [s for s in spans if s.name == tracing.PREFILL]
    assert sorted(dict(s.attributes or {})[tracing.ATTEMPT] for s in prefills) == [0, 1]
    assert {dict(s.attributes or {})[tracing.SERVER_PORT] for s in prefills} == {
        e.server.port for e in traced.rig.prefill if e.server is not None
    }
    for span in prefills:
        attrs = dict(span.attributes or {})
        assert span.status.status_code == StatusCode.ERROR
        assert attrs[tracing.HTTP_STATUS] == 500 and attrs[tracing.ERROR_TYPE] == "status_5xx"
    assert not [s for s in spans if s.name == tracing.DECODE]
    (request,) = [s for s in spans if s.name == tracing.REQUEST]
    assert dict(request.attributes or {})[tracing.HTTP_STATUS] == 502
    assert request.status.status_code == StatusCode.ERROR


async def test_a_decode_failure_before_the_first_byte_is_an_error_span_and_the_request_status(make_traced):
    traced = await make_traced()
    traced.rig.d.actions += [503, 503]
    status, _, _ = await traced.rig.chat([USER])
    assert status == 502
    spans = await traced.spans(1)
    decodes = [s for s in spans if s.name == tracing.DECODE]
    assert [dict(s.attributes or {})[tracing.ATTEMPT] for s in decodes] == [0, 1]
    assert all(s.status.status_code == StatusCode.ERROR for s in decodes)
    (request,) = [s for s in spans if s.name == tracing.REQUEST]
    assert dict(request.attributes or {})[tracing.HTTP_STATUS] == 502
    assert request.status.status_code == StatusCode.ERROR


async def test_a_stream_broken_after_its_first_byte_ends_its_decode_span_in_error(make_traced):
    traced = await make_traced()
    traced.rig.d.actions.append("break")
    status, _, _ = await traced.rig.chat([USER], stream=True)
    assert status == 200
    spans = await traced.spans(1)
    (decode,) = [s for s in spans if s.name == tracing.DECODE]
    assert decode.status.status_code == StatusCode.ERROR
    assert dict(decode.attributes or {})[tracing.ERROR_TYPE] == "stream_broken"


async def test_unsampled_requests_export_nothing_but_still_tell_the_engines_not_to_sample(make_traced):
    traced = await make_traced(tracing={"sample_ratio": 0.0})
    status, _, _ = await traced.rig.chat([USER])
    assert status == 200
    tracer = traced.rig.router.live.deps.tracer
    assert tracer is not None
    await asyncio.sleep(0.05)
    tracer.force_flush()
    assert traced.exporter.get_finished_spans() == ()
    assert int(traced.rig.p.seen[0].headers["traceparent"][-2:], 16) & 1 == 0  # the sampled flag is off
    # A sampled client trace is followed whatever the ratio (parent-based).
    await traced.rig.chat([USER], conv="c2", headers={"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"})
    assert len([s for s in await traced.spans(1) if s.name == tracing.REQUEST]) == 1


async def test_tracing_off_creates_nothing_and_passes_no_trace_context_on(make_rig):
    rig = await make_rig()
    assert rig.router.live.deps.tracer is None
    status, _, _ = await rig.chat([USER], headers={"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"})
    assert status == 200
    assert "traceparent" not in rig.p.seen[0].headers and "traceparent" not in rig.d.seen[0].headers


def test_tracing_off_never_loads_opentelemetry():
    """The router's modules, a Router with the default config and its request path never import OpenTelemetry."""
    script = """
import asyncio, sys
from duplex_sidecars.router import app, cli, live, pipeline
from duplex_sidecars.router.config import RouterConfig

async def main():
    router = app.Router(RouterConfig(prefill=["http://127.0.0.1:9"], decode=["http://127.0.0.1:9"]))
    server = await app.RouterServer(router).start()
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    body = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'
    writer.write(b"POST /v1/chat/completions HTTP/1.1\\r\\nHost: x\\r\\nContent-Type: application/json\\r\\n"
                 b"traceparent: 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\\r\\n"
                 b"Content-Length: %d\\r\\n\\r\\n%s" % (len(body), body))
    await writer.drain()
    assert (await reader.readline()).startswith(b"HTTP/1.1 5"), "no engine listens: an error, through the pipeline"
    writer.close()
    await server.close()

asyncio.run(main())
loaded = sorted(m for m in sys.modules if m.startswith("opentelemetry") or m.endswith("router.tracing"))
assert not loaded, loaded
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]


async def test_a_reload_switches_tracing_on_off_and_to_new_settings(make_rig):
    rig = await make_rig()
    router = rig.router
    assert router.live.deps.tracer is None
    on = router.config.model_copy(update={"tracing": TracingConfig(endpoint=ENDPOINT)})
    await router.apply(on)
    first = router.live.deps.tracer
    assert first is not None
    await router.apply(on.model_copy(update={"reload_interval_seconds": 3.0}))  # tracing unchanged: the same tracer
    assert router.live.deps.tracer is first
    await router.apply(on.model_copy(update={"tracing": TracingConfig(endpoint=ENDPOINT, sample_ratio=0.5)}))
    second = router.live.deps.tracer
    assert second is not None and second is not first
    assert first._processor._batch_processor._shutdown  # the old one was flushed and stopped
    await router.apply(on.model_copy(update={"tracing": TracingConfig()}))
    assert router.live.deps.tracer is None
    assert second._processor._batch_processor._shutdown


def test_the_tracing_config():
    assert TracingConfig().endpoint is None
    assert TracingConfig().sample_ratio == 1.0 and TracingConfig().service_name == "duplex-router"
    for bad in ("collector:4318", "ftp://x", "http://", "http://a b"):
        with pytest.raises(ValueError):
            TracingConfig(endpoint=bad)
    for bad_ratio in (-0.1, 1.5):
        with pytest.raises(ValueError):
            TracingConfig(endpoint=ENDPOINT, sample_ratio=bad_ratio)
    assert tracing.traces_url("http://c:4318") == "http://c:4318/v1/traces"
    assert tracing.traces_url("http://c:4318/") == "http://c:4318/v1/traces"
    assert tracing.traces_url("https://c/otlp/v1/traces") == "https://c/otlp/v1/traces"


@pytest.mark.parametrize("stream", [False, True])
async def test_the_ttft_histogram_links_a_traced_turn_to_its_trace_for_openmetrics_scrapers(make_traced, stream):
    traced = await make_traced(admin_port=0)
    rig = traced.rig
    status, _, _ = await rig.chat([USER], stream=stream)
    assert status == 200
    (request,) = [s for s in await traced.spans(1) if s.name == tracing.REQUEST]
    trace_id = hexid(request.context.trace_id, 32)
    url = rig.server.admin_url + "/metrics"
    async with rig.session.get(url, headers={"Accept": "application/openmetrics-text; version=1.0.0"}) as resp:
        assert resp.headers["Content-Type"].startswith("application/openmetrics-text")
        exposition = await resp.text()
    ttft = [
        line for line in exposition.splitlines() if line.startswith("duplex_router_time_to_first_token_seconds_bucket")
    ]
    assert any(f'# {{trace_id="{trace_id}"}}' in line for line in ttft), ttft
    async with rig.session.get(url) as resp:  # the classic text format has no exemplars
        assert "trace_id" not in await resp.text()


async def test_an_untraced_router_puts_no_exemplar(make_rig):
    rig = await make_rig(admin_port=0)
    assert (await rig.chat([USER]))[0] == 200
    url = rig.server.admin_url + "/metrics"
    async with rig.session.get(url, headers={"Accept": "application/openmetrics-text"}) as resp:
        assert "trace_id" not in await resp.text()

"""Traces end to end against a real trace backend: Jaeger v2 all-in-one (OTLP receiver, in-memory storage, query API;
hack/build-tools.sh builds it), a `duplex router` process with tracing on, and two simulated engines started with
vLLM's --otlp-traces-endpoint (OTLP/HTTP, as OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf makes vLLM export).

A two-turn conversation whose second turn reads decode's blocks back must come out of Jaeger's query API as one
tree: the router's request span and both leg spans; under the prefill leg the prefill engine's
llm_request with its kv_read of decode's blocks; under the decode leg the decode engine's llm_request with its
kv_read of prefill's. Each wait polls for a condition; nothing sleeps a fixed time.

A missing Jaeger binary fails the test, in CI as anywhere else: the fix is one command."""

from __future__ import annotations

import json
import secrets
import time
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from duplex_dev.launch.jaeger import JaegerProcess, only
from duplex_dev.launch.router import RouterProcess
from duplex_dev.launch.sim import SimProcess
from duplex_sidecars.router import tracing as router_tracing
from duplex_sidecars.sim import tracing as sim_tracing

pytestmark = [pytest.mark.nixl, pytest.mark.timeout(180)]

SERVER, CLIENT = 2, 3  # OTLP's SpanKind values, as Jaeger's API v3 returns them
LONG = "Please summarise the following report in detail. " * 12  # well above the recompute threshold
# Spans reach Jaeger within a batch delay of their end: 100 ms here instead of the SDK's 5 s.
FAST_EXPORT = {"OTEL_BSP_SCHEDULE_DELAY": "100"}


@pytest.fixture(scope="module")
def engines(jaeger: JaegerProcess) -> Iterator[tuple[SimProcess, SimProcess]]:
    """Engines started as the operator starts vLLM with traces on: --otlp-traces-endpoint, the protocol and the
    service name from the environment."""
    endpoint = ("--otlp-traces-endpoint", jaeger.otlp_url + "/v1/traces")

    def env(role: str) -> dict[str, str]:
        return {
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
            "OTEL_SERVICE_NAME": f"sim-{role}",
            **FAST_EXPORT,
        }

    # Prefill without a prefix cache: turn 2's reuse is a read of decode's blocks, never a local hit.
    prefill = SimProcess("prefill", "--no-enable-prefix-caching", *endpoint, env=env("prefill"))
    decode = SimProcess("decode", *endpoint, env=env("decode"))
    try:
        prefill.start(), decode.start()
        prefill.wait_ready(), decode.wait_ready()
        yield prefill, decode
    finally:
        prefill.stop(), decode.stop()


def wait_for(what: str, check: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"not within {timeout:g} s: {what}"
        time.sleep(0.1)


def traceparent() -> tuple[str, str, str]:
    """A client's trace id and span id, and the traceparent that carries them."""
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return trace_id, span_id, f"00-{trace_id}-{span_id}-01"


def turn(url: str, messages: list[dict[str, Any]], header: str) -> dict[str, Any]:
    """One chat turn through the router, in the client's trace `header` (a traceparent)."""
    body = {"model": "sim", "messages": messages, "max_tokens": 8, "conversation_id": "traced"}
    request = urllib.request.Request(
        url + "/v1/chat/completions",
        json.dumps(body).encode(),
        {"content-type": "application/json", "traceparent": header},
    )
    with urllib.request.urlopen(request, timeout=60) as resp:
        assert resp.status == 200
        answer: dict[str, Any] = json.loads(resp.read())
        return answer


def test_a_reused_turn_is_one_tree_from_the_router_through_both_engines_and_their_kv_reads(
    jaeger: JaegerProcess, engines: tuple[SimProcess, SimProcess]
) -> None:
    prefill, decode = engines
    config = {"tracing": {"endpoint": jaeger.otlp_url, "service_name": "duplex-router"}}
    with RouterProcess(prefill=[prefill.url], decode=[decode.url], config=config, env=FAST_EXPORT) as router:
        first_trace, _, header = traceparent()
        messages: list[dict[str, Any]] = [{"role": "user", "content": LONG}]
        first = turn(router.url, messages, header)
        messages += [first["choices"][0]["message"], {"role": "user", "content": "And the second part?"}]
        trace_id, client_span, header = traceparent()
        turn(router.url, messages, header)

        def tree_complete() -> bool:
            spans = jaeger.spans(trace_id)
            names = {(s.service, s.name) for s in spans}
            return {
                ("duplex-router", router_tracing.REQUEST),
                ("duplex-router", router_tracing.PREFILL),
                ("duplex-router", router_tracing.DECODE),
                ("sim-prefill", sim_tracing.REQUEST_SPAN),
                ("sim-prefill", sim_tracing.KV_READ_SPAN),
                ("sim-decode", sim_tracing.REQUEST_SPAN),
                ("sim-decode", sim_tracing.KV_READ_SPAN),
            } <= names

        wait_for(f"trace {trace_id} in Jaeger with the router's and both engines' spans", tree_complete)
    spans = jaeger.spans(trace_id)
    assert {s.trace_id for s in spans} == {trace_id}

    request = only(spans, service="duplex-router", name=router_tracing.REQUEST)
    assert request.kind == SERVER
    assert request.parent_id == client_span  # the client's trace, continued
    assert request.attributes[router_tracing.REUSE] == "hit"
    assert request.attributes[router_tracing.TOKENS_READ_BACK] > 0
    assert request.attributes[router_tracing.HTTP_STATUS] == 200
    prefill_leg = only(spans, service="duplex-router", name=router_tracing.PREFILL)
    decode_leg = only(spans, service="duplex-router", name=router_tracing.DECODE)
    for child in (prefill_leg, decode_leg):
        assert child.parent_id == request.span_id
    assert prefill_leg.kind == decode_leg.kind == CLIENT
    assert prefill_leg.attributes[router_tracing.REPLAY] is True
    assert prefill_leg.attributes[router_tracing.SERVER_PORT] == prefill.port
    assert decode_leg.attributes[router_tracing.SERVER_PORT] == decode.port

    # The prefill engine's request hangs under the prefill leg, its read of decode's blocks under that.
    p_request = only(spans, service="sim-prefill", name=sim_tracing.REQUEST_SPAN)
    assert p_request.kind == SERVER and p_request.parent_id == prefill_leg.span_id
    assert p_request.attributes[sim_tracing.GEN_AI_USAGE_PROMPT_TOKENS] > 0
    read_back = only(spans, service="sim-prefill", name=sim_tracing.KV_READ_SPAN)
    assert read_back.parent_id == p_request.span_id
    assert read_back.attributes[sim_tracing.KV_DIRECTION] == "decode_to_prefill"
    assert read_back.attributes[sim_tracing.KV_OUTCOME] == "ok"
    assert read_back.attributes[sim_tracing.KV_REMOTE_ENGINE] == decode.engine_id
    assert read_back.attributes[sim_tracing.KV_BYTES] > 0 and not read_back.error

    # The decode engine's request under the decode leg, its read of prefill's blocks under that.
    d_request = only(spans, service="sim-decode", name=sim_tracing.REQUEST_SPAN)
    assert d_request.kind == SERVER and d_request.parent_id == decode_leg.span_id
    assert d_request.attributes[sim_tracing.GEN_AI_USAGE_COMPLETION_TOKENS] > 0
    read = only(spans, service="sim-decode", name=sim_tracing.KV_READ_SPAN)
    assert read.parent_id == d_request.span_id
    assert read.attributes[sim_tracing.KV_DIRECTION] == "prefill_to_decode"
    assert read.attributes[sim_tracing.KV_REMOTE_ENGINE] == prefill.engine_id

    # One tree: every span but the router's request has its parent in the trace.
    ids = {s.span_id for s in spans}
    assert all(s.parent_id in ids for s in spans if s is not request), [(s.name, s.parent_id) for s in spans]

    # Turn 1 was a miss in a trace of its own: prefill computed, and read nothing.
    wait_for(
        f"turn 1's trace {first_trace} in Jaeger",
        lambda: (
            {("sim-decode", sim_tracing.KV_READ_SPAN), ("duplex-router", router_tracing.REQUEST)}
            <= {(s.service, s.name) for s in jaeger.spans(first_trace)}
        ),
    )
    first_spans = jaeger.spans(first_trace)
    first_request = only(first_spans, service="duplex-router", name=router_tracing.REQUEST)
    assert first_request.attributes[router_tracing.REUSE] == "miss"
    assert first_request.attributes[router_tracing.MISS_REASON] == "no_entry"
    assert not [s for s in first_spans if s.service == "sim-prefill" and s.name == sim_tracing.KV_READ_SPAN]

"""Real vLLM engines started from a serving with `spec.tracing` (the operator's rendering: --otlp-traces-endpoint,
OTLP/HTTP, a service name per role) behind a tracing router, exporting to a real Jaeger: a follow-up turn that reads
decode's KV back is one tree, the router's request and legs with vLLM's own request span under each leg."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from duplex_dev.launch.jaeger import JaegerProcess, only
from duplex_dev.launch.router import RouterProcess
from duplex_sidecars.router import tracing as router_tracing

from .conftest import KNOWN_TTL, ROUTER_CONFIG, Engines, engine_pair
from .rig import LONG, chat, chat_body, post, wait_ready_engines

ROOT = Path(__file__).resolve().parents[2]
VLLM_SPAN = "llm_request"  # vLLM's span of a request (vllm/tracing.py)
FAST_EXPORT = {"OTEL_BSP_SCHEDULE_DELAY": "100"}  # spans reach Jaeger within 100 ms of their end, not 5 s


@pytest.fixture
def traced_engines(
    jaeger: JaegerProcess, request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Engines]:
    """A pair of its own, rendered from examples/local.yaml with spec.tracing pointing at the test's Jaeger."""
    doc = yaml.safe_load((ROOT / "examples/local.yaml").read_text())
    doc["spec"]["tracing"] = {"endpoint": jaeger.otlp_url}
    example = tmp_path / "traced.yaml"
    example.write_text(yaml.safe_dump(doc))
    for name, value in FAST_EXPORT.items():
        monkeypatch.setenv(name, value)
    with engine_pair(request, str(example)) as pair:
        yield pair


def wait_for(what: str, check: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"not within {timeout:g} s: {what}"
        time.sleep(0.2)


@pytest.mark.own_engines
def test_a_reused_turn_on_real_vllm_is_one_tree_with_vllms_own_spans(
    jaeger: JaegerProcess, traced_engines: Engines
) -> None:
    prefill, decode = traced_engines.prefill, traced_engines.decode
    # The engines' service names, as the operator renders them for examples/local.yaml (metadata.name: local).
    assert prefill.cmd.env["OTEL_SERVICE_NAME"] == "local-prefill"
    assert prefill.cmd.env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] == "http/protobuf"
    assert prefill.cmd.flags["--otlp-traces-endpoint"] == jaeger.otlp_url + "/v1/traces"
    config = {**ROUTER_CONFIG, "conversation": KNOWN_TTL, "tracing": {"endpoint": jaeger.otlp_url}}
    with RouterProcess(
        prefill=[prefill.url], decode=[decode.url], config=config, env=FAST_EXPORT, startup_timeout=120.0
    ) as router:
        wait_ready_engines(router)
        messages = [{"role": "user", "content": LONG}]
        first = chat(router.url, messages, "traced")
        messages += [{"role": "assistant", "content": first.text}, {"role": "user", "content": "Go on."}]
        trace_id, client_span = secrets.token_hex(16), secrets.token_hex(8)
        body = {**chat_body(messages), "conversation_id": "traced"}
        second = post(router.url + "/v1/chat/completions", body, {"traceparent": f"00-{trace_id}-{client_span}-01"})
        assert second.status == 200, second.raw[:500]
        timing = {k.lower(): v for k, v in second.headers.items()}.get("server-timing", "")
        assert 'kv;desc="hit' in timing, second.headers  # decode's KV read back

        def tree_complete() -> bool:
            names = {(s.service, s.name) for s in jaeger.spans(trace_id)}
            return {
                ("duplex-router", router_tracing.REQUEST),
                ("duplex-router", router_tracing.PREFILL),
                ("duplex-router", router_tracing.DECODE),
                ("local-prefill", VLLM_SPAN),
                ("local-decode", VLLM_SPAN),
            } <= names

        wait_for(f"trace {trace_id}: the router's spans and both vLLM engines'", tree_complete)
    spans = jaeger.spans(trace_id)
    request = only(spans, service="duplex-router", name=router_tracing.REQUEST)
    assert request.parent_id == client_span and request.attributes[router_tracing.REUSE] == "hit"
    for role, leg_name in (("prefill", router_tracing.PREFILL), ("decode", router_tracing.DECODE)):
        leg = only(spans, service="duplex-router", name=leg_name)
        assert leg.parent_id == request.span_id
        engine_span = only(spans, service=f"local-{role}", name=VLLM_SPAN)
        assert engine_span.parent_id == leg.span_id, (role, engine_span)

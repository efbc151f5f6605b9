"""spec.tracing on the children: the router's tracing config, and vLLM's own OTLP exporter on the engine pods.

vLLM exports over gRPC unless told otherwise, and its --otlp-traces-endpoint is the exporter's full URL; duplex speaks
OTLP/HTTP to one collector for both, so the engines get `<endpoint>/v1/traces` and the protocol in their environment.
Each role is its own service.name (`<serving>-prefill`, `<serving>-decode`, `<serving>-router`).
"""

from __future__ import annotations

from typing import Any

from duplex.api.spec import DisaggregatedServingSpec
from duplex_sidecars.router.config import TracingConfig, traces_url


def _engines_traced(spec: DisaggregatedServingSpec) -> bool:
    return spec.tracing.endpoint is not None and spec.tracing.engines


def engine_args(spec: DisaggregatedServingSpec) -> list[str]:
    if not _engines_traced(spec):
        return []
    assert spec.tracing.endpoint is not None
    return ["--otlp-traces-endpoint", traces_url(spec.tracing.endpoint)]


def engine_env(spec: DisaggregatedServingSpec, serving: str, role: str) -> list[dict[str, Any]]:
    if not _engines_traced(spec):
        return []
    return [
        {"name": "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "value": "http/protobuf"},
        {"name": "OTEL_SERVICE_NAME", "value": f"{serving}-{role}"},
    ]


def router_config(spec: DisaggregatedServingSpec, serving: str) -> TracingConfig:
    tracing = spec.tracing
    return TracingConfig(endpoint=tracing.endpoint, sample_ratio=tracing.sample_ratio, service_name=f"{serving}-router")

"""spec.tracing on the children: off by default; on, the routers export to the collector and the engines run vLLM's
own OTLP exporter over HTTP to the same collector, each role under its own service name."""

from __future__ import annotations

import json
from typing import Any

from dsv_helpers import children, container, env_map, find

from duplex.children.router import CONFIG_KEY

ON = {"tracing": {"endpoint": "http://collector.obs:4318", "sampleRatio": 0.5}}


def router_tracing(objs: list[dict[str, Any]]) -> dict[str, Any]:
    config = json.loads(find(objs, "ConfigMap", "demo-router")["data"][CONFIG_KEY])
    return dict(config["tracing"])


def test_off_by_default_nothing_is_rendered() -> None:
    objs = children()
    for role in ("prefill", "decode"):
        ctr = container(find(objs, "Deployment", f"demo-{role}"))
        assert "--otlp-traces-endpoint" not in ctr["args"]
        assert not {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_SERVICE_NAME"} & set(env_map(ctr))
    assert router_tracing(objs)["endpoint"] is None


def test_on_the_engines_and_the_router_export_to_one_collector() -> None:
    objs = children(ON)
    for role in ("prefill", "decode"):
        ctr = container(find(objs, "Deployment", f"demo-{role}"))
        i = ctr["args"].index("--otlp-traces-endpoint")
        assert ctr["args"][i + 1] == "http://collector.obs:4318/v1/traces"  # vLLM's exporter takes the full URL
        env = env_map(ctr)
        assert env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"]["value"] == "http/protobuf"  # vLLM defaults to gRPC
        assert env["OTEL_SERVICE_NAME"]["value"] == f"demo-{role}"
    assert router_tracing(objs) == {
        "endpoint": "http://collector.obs:4318",
        "sample_ratio": 0.5,
        "service_name": "demo-router",
    }


def test_engines_off_traces_the_routers_only() -> None:
    objs = children({"tracing": {**ON["tracing"], "engines": False}})
    assert "--otlp-traces-endpoint" not in container(find(objs, "Deployment", "demo-decode"))["args"]
    assert router_tracing(objs)["endpoint"] == "http://collector.obs:4318"

"""The serving's InferencePool (Gateway API Inference Extension, inference.networking.k8s.io/v1), with
router.inferencePool.enabled: a backend a Gateway's HTTPRoute can name, for platforms built on InferencePools.

The pool selects the router pods, never the engines. The router is stateful: it chooses the prefill and decode
engines of each turn and carries the conversation's KV metadata from one turn to the next, and the engines answer
only the router (the engine key, the NetworkPolicies). A pool of engines would let the Gateway's endpoint picker
send a request straight to an engine, past all of that. So the endpoint picker only balances the routers, and
`targetPorts` is the routers' API port. docs/architecture.md ("Behind a Gateway: an InferencePool of routers, not
of engines") has the reasoning.

The engine pods carry llm-d's role label (prefill, decode) while the pool is enabled, so that llm-d's tools and
dashboards recognize them; only then, since a pod label change rolls the engines.
"""

from __future__ import annotations

from typing import Any

from duplex.api.spec import DisaggregatedServingSpec
from duplex.children.kinds import INFERENCE_POOL
from duplex.children.labels import HTTP_PORT, child_name, labels, selector

LLM_D_ROLE_LABEL = "llm-d.ai/role"  # llm-d's scheduler filters engines on it: "prefill", "decode"


def pool_name(serving: str) -> str:
    """The router Service's name: the same pods, another kind."""
    return child_name(serving, "router")


def inference_pool(spec: DisaggregatedServingSpec, serving: str, namespace: str) -> list[dict[str, Any]]:
    """The InferencePool of the router pods, or nothing when it is not enabled."""
    pool = spec.router.inference_pool
    if not pool.enabled:
        return []
    body: dict[str, Any] = {
        "selector": {"matchLabels": selector(serving, "router")},
        "targetPorts": [{"number": HTTP_PORT}],  # the pods' port, not the Service's
    }
    picker = pool.endpoint_picker
    if picker is not None:
        body["endpointPickerRef"] = {
            "name": picker.name,
            "port": {"number": picker.port},
            "failureMode": picker.failure_mode,
        }
    metadata = {"name": pool_name(serving), "namespace": namespace, "labels": labels(serving, "router")}
    return [INFERENCE_POOL.manifest(metadata, spec=body)]


def engine_pod_labels(spec: DisaggregatedServingSpec, role: str) -> dict[str, str]:
    """llm-d's role label for an engine role's pods, while the pool is enabled (else none: no roll on upgrade)."""
    return {LLM_D_ROLE_LABEL: role} if spec.router.inference_pool.enabled else {}

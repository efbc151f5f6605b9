"""Headless Services per engine role (their EndpointSlices feed the router), the router's Service, and the drain
Service through which decode pods' preStop hooks ask the routers' admin port what they still hold."""

from __future__ import annotations

from typing import Any

from duplex.api.spec import DisaggregatedServingSpec
from duplex.children.kinds import SERVICE
from duplex.children.labels import ADMIN_PORT, HTTP_PORT, child_name, labels, selector
from duplex.children.lifecycle import drain_service_name
from duplex.children.lws import LEADER_SELECTOR
from duplex.children.roles import EngineRole


def engine_service(spec: DisaggregatedServingSpec, serving: str, namespace: str, role: str) -> dict[str, Any]:
    """A role whose instances span nodes selects its leaders only: the routers pair instances through them, and a
    leader serves the NIXL handshake of all its ranks (vLLM's scheduler runs there; vllm #26338)."""
    multinode = EngineRole.of(spec, role).multinode
    return SERVICE.manifest(
        {"name": child_name(serving, role), "namespace": namespace, "labels": labels(serving, role)},
        spec={
            "clusterIP": "None",
            "selector": selector(serving, role) | (LEADER_SELECTOR if multinode else {}),
            "ports": [
                {"name": "http", "port": HTTP_PORT, "targetPort": "http", "protocol": "TCP"},
                {
                    "name": "nixl-side",
                    "port": spec.kv_transfer.side_channel_port,
                    "targetPort": "nixl-side",
                    "protocol": "TCP",
                },
            ],
        },
    )


def router_service(spec: DisaggregatedServingSpec, serving: str, namespace: str) -> dict[str, Any]:
    svc = spec.router.service
    metadata: dict[str, Any] = {"name": child_name(serving, "router"), "namespace": namespace}
    metadata["labels"] = labels(serving, "router")
    if svc.annotations:
        metadata["annotations"] = dict(svc.annotations)
    return SERVICE.manifest(
        metadata,
        spec={
            "type": svc.type,
            "selector": selector(serving, "router"),
            "ports": [{"name": "http", "port": svc.port, "targetPort": "http", "protocol": "TCP"}],
        },
    )


def drain_service(serving: str, namespace: str) -> dict[str, Any]:
    """ClusterIP, in the cluster only: the admin port never goes into the router's own Service, which may be a
    LoadBalancer. With several routers any one answers (they share the Redis store)."""
    return SERVICE.manifest(
        {"name": drain_service_name(serving), "namespace": namespace, "labels": labels(serving, "router")},
        spec={
            "type": "ClusterIP",
            "selector": selector(serving, "router"),
            "ports": [{"name": "admin", "port": ADMIN_PORT, "targetPort": "admin", "protocol": "TCP"}],
        },
    )


def router_endpoint(spec: DisaggregatedServingSpec, serving: str, namespace: str) -> str:
    return f"http://{child_name(serving, 'router')}.{namespace}.svc:{spec.router.service.port}"

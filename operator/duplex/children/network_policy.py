"""NetworkPolicies of one serving: nobody reaches the engines but its router.

* Engines (one policy per role): the HTTP port only from this serving's router pods, and from the pods of
  `network.networkPolicy.metricsNamespaces` (vLLM serves /metrics on the same port; every path but /health and /metrics
  needs the engine key: vLLM guards /v1, the engine guard (engine_guard.py) the rest); the NIXL side channel and
  transport only from the other role's pods of this serving (prefill reads decode's blocks back, decode reads
  prefill's). UCX's TCP transport listens on ports it picks at run time, so the transport rule opens every port but HTTP
  to the peer role, and only to it. A role whose instances span nodes also opens the same ports to its own pods: the
  ranks of an instance rendezvous and talk over TCP (never over HTTP).
* Router: its API port open to everyone (it is the API edge); its admin port (/metrics, /ready's detail: the
  topology) only from the pods of `metricsNamespaces`, and from this serving's decode pods, whose preStop hook asks
  it what they still hold (/drain, with the engine key).

Only ingress is fenced (engines pull weights from a hub, the router talks to the API server). EFA traffic (SRD)
goes from device to device past the kernel network stack, so no NetworkPolicy sees it: it is bounded by the EFA
security group. Kubelet probes come from the node, which CNIs let through.
"""

from __future__ import annotations

from typing import Any

from duplex.api.spec import DisaggregatedServingSpec
from duplex.children.kinds import NETWORK_POLICY
from duplex.children.labels import ADMIN_PORT, HTTP_PORT, child_name, labels, selector
from duplex.children.roles import EngineRole

NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"  # set by the API server on every namespace
PEER = {"prefill": "decode", "decode": "prefill"}
_HIGHEST_PORT = 65535
_LOWEST_UNPRIVILEGED = 1024


def _tcp(port: int, end: int | None = None) -> dict[str, Any]:
    return {"protocol": "TCP", "port": port, **({"endPort": end} if end is not None else {})}


def _all_but_http() -> list[dict[str, Any]]:
    """Every unprivileged port but the engines' HTTP port: listeners that pick their port at run time."""
    return [_tcp(_LOWEST_UNPRIVILEGED, HTTP_PORT - 1), _tcp(HTTP_PORT + 1, _HIGHEST_PORT)]


def transport_ports(spec: DisaggregatedServingSpec) -> list[dict[str, Any]]:
    """The side channel, then every unprivileged port but the engines' HTTP port (UCX's listeners)."""
    return [_tcp(spec.kv_transfer.side_channel_port), *_all_but_http()]


def _from_scrapers(spec: DisaggregatedServingSpec, port: int) -> list[dict[str, Any]]:
    """The rule letting the pods of `metricsNamespaces` reach `port` (none if there are none)."""
    scrapers = spec.network.network_policy.metrics_namespaces
    if not scrapers:
        return []
    namespaces = {"matchExpressions": [{"key": NAMESPACE_NAME_LABEL, "operator": "In", "values": list(scrapers)}]}
    return [{"from": [{"namespaceSelector": namespaces}], "ports": [_tcp(port)]}]


def engine_policy(spec: DisaggregatedServingSpec, serving: str, namespace: str, role: str) -> dict[str, Any]:
    ingress: list[dict[str, Any]] = [
        {"from": [{"podSelector": {"matchLabels": selector(serving, "router")}}], "ports": [_tcp(HTTP_PORT)]},
        *_from_scrapers(spec, HTTP_PORT),
    ]
    ingress.append(
        {"from": [{"podSelector": {"matchLabels": selector(serving, PEER[role])}}], "ports": transport_ports(spec)}
    )
    if EngineRole.of(spec, role).multinode:
        # The ranks of an instance: torch.distributed's rendezvous at the leader, NCCL's bootstrap, vLLM's queues.
        ingress.append({"from": [{"podSelector": {"matchLabels": selector(serving, role)}}], "ports": _all_but_http()})
    return NETWORK_POLICY.manifest(
        {"name": child_name(serving, role), "namespace": namespace, "labels": labels(serving, role)},
        spec={"podSelector": {"matchLabels": selector(serving, role)}, "policyTypes": ["Ingress"], "ingress": ingress},
    )


def router_policy(spec: DisaggregatedServingSpec, serving: str, namespace: str) -> dict[str, Any]:
    """Open on the router's API port, so that a namespace with a default-deny policy still reaches its API edge;
    the admin port to scrapers only."""
    return NETWORK_POLICY.manifest(
        {"name": child_name(serving, "router"), "namespace": namespace, "labels": labels(serving, "router")},
        spec={
            "podSelector": {"matchLabels": selector(serving, "router")},
            "policyTypes": ["Ingress"],
            "ingress": [
                {"ports": [_tcp(HTTP_PORT)]},
                {"from": [{"podSelector": {"matchLabels": selector(serving, "decode")}}], "ports": [_tcp(ADMIN_PORT)]},
                *_from_scrapers(spec, ADMIN_PORT),
            ],
        },
    )


def network_policies(spec: DisaggregatedServingSpec, serving: str, namespace: str) -> list[dict[str, Any]]:
    if not spec.network.network_policy.enabled:
        return []
    return [
        *(engine_policy(spec, serving, namespace, r) for r in ("prefill", "decode")),
        router_policy(spec, serving, namespace),
    ]

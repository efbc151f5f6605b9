"""How engine pods end without losing what they hold (docs/architecture.md, "Draining").

* Decode: a preStop hook (duplex_drain.py, from the engine guard's ConfigMap) holds a terminating pod until the routers
  hold no active binding (stored within drain.activeSeconds) and no leg on it, or until the drain deadline. Meanwhile
  the pod serves: its EndpointSlice entry is `terminating` but `serving`, so the routers read its blocks for each bound
  conversation's next turn and bind that turn elsewhere. Then SIGTERM; vLLM's --shutdown-timeout lets generations still
  running finish.
* Prefill: a preStop hook (the same script) holds a terminating pod while it is the only prefill pod of its KV
  revision the routers can use (a node drain or an eviction of a single prefill), until another serves or
  prefill.drain.deadlineSeconds; the routers give it new legs only when nothing else is left. A rollout's surge pod is
  Ready first, so the hook returns at once then. After SIGTERM, --shutdown-timeout keeps it stepping until decode has
  pulled what it prefilled, which the block lease bounds.
* Worker ranks of a multi-node instance (a LeaderWorkerSet): a preStop hook (the same script, `--leader-env`) holds
  a rank while its leader still answers, so that a group going as a unit keeps its instance whole while the leader
  drains; the rank's deadline is the leader's hook and shutdown together.
* Router: a preStop sleep lets the endpoint controller and every node's kube-proxy take the pod out of the
  Service before it stops listening; on SIGTERM it stops accepting and lets requests and streams in flight finish
  (router config shutdown_grace_seconds).
* The grace period is the sum of what the hook and the process may take, plus a margin for the process to exit.
"""

from __future__ import annotations

from typing import Any

from duplex.api.spec import DisaggregatedServingSpec
from duplex.children import duplex_drain
from duplex.children.engine_guard import MOUNT_PATH
from duplex.children.labels import ADMIN_PORT, HTTP_PORT, child_name

DRAIN_SCRIPT = f"{duplex_drain.__name__.rsplit('.', 1)[-1]}.py"
DECODE_SHUTDOWN_SECONDS = 30  # generations still running when a drain deadline cut the wait
LEASE_MARGIN_SECONDS = 10  # beyond prefill's block lease: decode's pull and its retry
EXIT_MARGIN_SECONDS = 10  # for vLLM to tear down after its shutdown timeout
ROUTER_UNLIST_SECONDS = 5  # the router's preStop sleep: its endpoint leaves every node's kube-proxy meanwhile
ROUTER_SHUTDOWN_SECONDS = 120  # a streamed agent turn in flight when the router is told to stop
LEADER_ADDRESS_ENV = "LWS_LEADER_ADDRESS"  # what LWS's pod webhook gives every rank of a group


def drain_service_name(serving: str) -> str:
    return child_name(serving, "drain")


def drain_deadline(spec: DisaggregatedServingSpec, role: str = "decode") -> int:
    """Seconds a terminating engine pod may hold in its preStop hook. Decode, for its bindings; default: how long
    decode retains blocks, which bounds the router's TTL, so no binding outlives it (the router's own TTL is a router
    field: changing it must not roll the engines). Prefill, while it is the last one serving."""
    if role == "prefill":
        return spec.prefill.drain.deadline_seconds
    explicit = spec.decode.drain.deadline_seconds
    return spec.kv_transfer.decode_blocks_ttl if explicit is None else explicit


def shutdown_timeout(spec: DisaggregatedServingSpec, role: str) -> int:
    """vLLM's --shutdown-timeout: how long the engine keeps stepping after SIGTERM for work it still has."""
    if role == "prefill":
        return spec.kv_transfer.lease_duration + LEASE_MARGIN_SECONDS
    return DECODE_SHUTDOWN_SECONDS


def args(spec: DisaggregatedServingSpec, role: str) -> list[str]:
    return ["--shutdown-timeout", str(shutdown_timeout(spec, role))]


def drains(spec: DisaggregatedServingSpec, role: str) -> bool:
    return drain_deadline(spec, role) > 0


def grace_seconds(spec: DisaggregatedServingSpec, role: str) -> int:
    """terminationGracePeriodSeconds: the preStop hook's deadline (it counts against the grace period), then the
    engine's shutdown timeout, then the exit margin."""
    hook = drain_deadline(spec, role) if drains(spec, role) else 0
    return hook + shutdown_timeout(spec, role) + EXIT_MARGIN_SECONDS


def pre_stop(spec: DisaggregatedServingSpec, serving: str, namespace: str, role: str) -> dict[str, Any] | None:
    """The engine pods' preStop hook (None with a drain deadline of 0)."""
    if not drains(spec, role):
        return None
    router = f"http://{drain_service_name(serving)}.{namespace}.svc:{ADMIN_PORT}"
    command = ["python3", f"{MOUNT_PATH}/{DRAIN_SCRIPT}", "--router", router, "--port", str(HTTP_PORT)]
    if role == "decode":
        command += ["--active", str(spec.decode.drain.active_seconds)]
    return {"exec": {"command": [*command, "--deadline", str(drain_deadline(spec, role))]}}


def router_grace_seconds() -> int:
    return ROUTER_UNLIST_SECONDS + ROUTER_SHUTDOWN_SECONDS + EXIT_MARGIN_SECONDS


def router_pre_stop() -> dict[str, Any]:
    return {"sleep": {"seconds": ROUTER_UNLIST_SECONDS}}


def worker_pre_stop(spec: DisaggregatedServingSpec, role: str) -> dict[str, Any] | None:
    """A worker rank's preStop hook (None when its role does not drain): hold while the leader answers, for as long
    as the leader's own hook and shutdown may take; the rank's grace period (grace_seconds) leaves the exit margin."""
    if not drains(spec, role):
        return None
    deadline = drain_deadline(spec, role) + shutdown_timeout(spec, role)
    command = ["python3", f"{MOUNT_PATH}/{DRAIN_SCRIPT}", "--leader-env", LEADER_ADDRESS_ENV]
    return {"exec": {"command": [*command, "--port", str(HTTP_PORT), "--deadline", str(deadline)]}}

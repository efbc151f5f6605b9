"""What turning on EFA (or picking an accelerator) adds to an engine pod: resources, env, volumes, placement."""

from __future__ import annotations

from typing import Any

from duplex.api.spec import CPU, GPU, NEURON, DisaggregatedServingSpec, RoleSpec
from duplex.children.labels import SERVING_LABEL

EFA_RESOURCE = "vpc.amazonaws.com/efa"
ZONE_KEY = "topology.kubernetes.io/zone"
LEAF_KEY = "topology.k8s.aws/network-node-layer-3"


def accelerator_count(role: RoleSpec) -> int:
    if role.accelerator.count is not None:
        return role.accelerator.count
    if role.accelerator.type == NEURON:
        return max(1, -(-role.tensor_parallel_size // 2))  # two NeuronCores per device
    # One device per rank: the instance's TP x PP ranks, spread evenly over its nodes (admission checks they divide).
    return role.tensor_parallel_size * role.pipeline_parallel_size // role.nodes_per_instance


# The KV cache of a cpu engine, in GiB of host memory, when the spec does not say.
CPU_KV_CACHE_GIB = 4


def resources(spec: DisaggregatedServingSpec, role: RoleSpec) -> dict[str, Any]:
    amounts: dict[str, Any] = {}
    if role.accelerator.type != CPU:  # a cpu engine has no device: its cpu request is what it computes on
        amounts[role.accelerator.type] = str(accelerator_count(role))
    if role.cpu:
        amounts["cpu"] = role.cpu
    if role.memory:
        amounts["memory"] = role.memory
    efa = spec.network.efa
    if efa.enabled:
        amounts[EFA_RESOURCE] = str(efa.devices_per_pod)
        amounts["hugepages-2Mi"] = efa.hugepages2_mi
    # Extended resources and hugepages must have requests == limits; so do we, for Guaranteed QoS.
    return {"requests": dict(amounts), "limits": dict(amounts)}


def accelerator_env(role: RoleSpec) -> list[dict[str, Any]]:
    if role.accelerator.type != CPU:
        return []
    # vLLM's CPU platform sizes its KV cache from this, not from --gpu-memory-utilization.
    return [{"name": "VLLM_CPU_KVCACHE_SPACE", "value": str(role.accelerator.kv_cache_gib or CPU_KV_CACHE_GIB)}]


def env(spec: DisaggregatedServingSpec) -> list[dict[str, Any]]:
    efa = spec.network.efa
    if not efa.enabled:
        return []
    return [
        {"name": "FI_PROVIDER", "value": "efa"},
        {"name": "FI_EFA_USE_DEVICE_RDMA", "value": "1"},
        {"name": "FI_EFA_USE_HUGE_PAGE", "value": "1"},
        {"name": "FI_EFA_FORK_SAFE", "value": "1" if efa.fork_safe else "0"},
        {"name": "LD_LIBRARY_PATH", "value": efa.library_path},
    ]


def security_context(spec: DisaggregatedServingSpec) -> dict[str, Any]:
    efa = spec.network.efa
    if efa.enabled and efa.privileged:
        return {"privileged": True, "capabilities": {"add": ["IPC_LOCK"]}}
    ctx: dict[str, Any] = {"allowPrivilegeEscalation": False, "seccompProfile": {"type": "RuntimeDefault"}}
    if efa.enabled:
        ctx["capabilities"] = {"add": ["IPC_LOCK"]}  # pinning NIXL-registered memory needs memlock
    return ctx


def shm_volume(spec: DisaggregatedServingSpec) -> dict[str, Any]:
    empty_dir: dict[str, Any] = {"medium": "Memory"}
    if spec.network.efa.enabled:
        empty_dir["sizeLimit"] = spec.network.efa.shm_size
    return {"name": "dshm", "emptyDir": empty_dir}


def tolerations(role: RoleSpec) -> list[dict[str, Any]]:
    taint_key = {GPU: "nvidia.com/gpu", NEURON: "aws.amazon.com/neuron"}.get(role.accelerator.type)
    auto = [{"key": taint_key, "operator": "Exists", "effect": "NoSchedule"}] if taint_key else []
    return auto + [t for t in role.tolerations if t not in auto]


def affinity(spec: DisaggregatedServingSpec, serving: str, role: RoleSpec) -> dict[str, Any] | None:
    """The role's affinity, plus same-zone co-placement of P and D (EFA traffic stays in one AZ)."""
    merged: dict[str, Any] = {k: v for k, v in (role.affinity or {}).items()}
    if not (spec.network.efa.enabled and spec.network.efa.same_zone):
        return merged or None
    peers = {"matchLabels": {SERVING_LABEL: serving}}
    pod_affinity = dict(merged.get("podAffinity") or {})
    required = list(pod_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or [])
    required.append({"labelSelector": peers, "topologyKey": ZONE_KEY})
    preferred = list(pod_affinity.get("preferredDuringSchedulingIgnoredDuringExecution") or [])
    preferred.append({"weight": 100, "podAffinityTerm": {"labelSelector": peers, "topologyKey": LEAF_KEY}})
    pod_affinity["requiredDuringSchedulingIgnoredDuringExecution"] = required
    pod_affinity["preferredDuringSchedulingIgnoredDuringExecution"] = preferred
    merged["podAffinity"] = pod_affinity
    return merged

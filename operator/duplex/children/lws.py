"""The LeaderWorkerSet (leaderworkerset.x-k8s.io/v1) of a role whose engine instance spans nodes (nodesPerInstance
above 1): one group of pods per instance, built from the single-node engine pod (engine.engine_pod_template), so
that every rank has the same EFA devices, hugepages, IPC_LOCK, env and volumes.

vLLM's multi-node launch with its multiprocessing backend (docs/serving/parallelism_scaling.md, "Running vLLM with
MultiProcessing"; docs/deployment/frameworks/lws.md): every pod runs `vllm serve` with the same model and
parallelism and `--nnodes N --node-rank R --master-addr <leader>`; the workers add `--headless` and serve no HTTP.
LWS gives each pod LWS_LEADER_ADDRESS and LWS_WORKER_INDEX, which the kubelet expands in the arguments.
"""

from __future__ import annotations

import copy
from typing import Any

from duplex.api.spec import DisaggregatedServingSpec
from duplex.children.kinds import LEADER_WORKER_SET
from duplex.children.labels import ENGINE_HASH_ANNOTATION, HTTP_PORT, config_hash
from duplex.children.roles import EngineRole

WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"  # "0" on the leader
EXCLUSIVE_TOPOLOGY_ANNOTATION = "leaderworkerset.sigs.k8s.io/exclusive-topology"
LEADER_SELECTOR = {WORKER_INDEX_LABEL: "0"}  # added to the role Service's selector: routers see leaders only


def rank_ports(spec: DisaggregatedServingSpec, role: EngineRole, nodes: range) -> list[int]:
    """The NIXL side-channel ports of the ranks on `nodes` (node ranks of one instance): base + dp_rank * tp_size
    + tp_rank (vllm #24249), with dp_rank 0. vLLM numbers a rank tp fastest, then pp (rank = pp_rank * tp + tp_rank),
    and gives each node a contiguous block of ranks."""
    tp, pp = role.spec.tensor_parallel_size, role.spec.pipeline_parallel_size
    per_node = tp * pp // role.spec.nodes_per_instance
    tp_ranks = {rank % tp for node in nodes for rank in range(node * per_node, (node + 1) * per_node)}
    return [spec.kv_transfer.side_channel_port + r for r in sorted(tp_ranks)]


def _ports(spec: DisaggregatedServingSpec, role: EngineRole, leader: bool) -> list[dict[str, Any]]:
    nodes = range(1) if leader else range(1, role.spec.nodes_per_instance)
    base = spec.kv_transfer.side_channel_port
    # The base port keeps its name (the role Service targets it); the others by their offset.
    side = [
        {"name": "nixl-side" if p == base else f"nixl-side-{p - base}", "containerPort": p, "protocol": "TCP"}
        for p in rank_ports(spec, role, nodes)
    ]
    return ([{"name": "http", "containerPort": HTTP_PORT, "protocol": "TCP"}] if leader else []) + side


def _multinode_args(role: EngineRole, leader: bool) -> list[str]:
    rank = "0" if leader else "$(LWS_WORKER_INDEX)"
    args = [
        "--distributed-executor-backend", "mp",
        "--nnodes", str(role.spec.nodes_per_instance),
        "--node-rank", rank,
        "--master-addr", "$(LWS_LEADER_ADDRESS)",
    ]  # fmt: skip
    return args if leader else [*args, "--headless"]


def _rank_template(
    spec: DisaggregatedServingSpec, role: EngineRole, template: dict[str, Any], leader: bool
) -> dict[str, Any]:
    out = copy.deepcopy(template)
    pod = out["spec"]
    engine = next(c for c in pod["containers"] if c["name"] == "vllm")
    engine["args"] = [*engine["args"], *_multinode_args(role, leader)]
    engine["ports"] = _ports(spec, role, leader)
    if not leader:
        # A headless rank serves no HTTP: nothing to probe, nothing to drain (its leader holds the instance).
        for key in ("startupProbe", "readinessProbe", "livenessProbe", "lifecycle"):
            engine.pop(key, None)
    out["metadata"]["annotations"][ENGINE_HASH_ANNOTATION] = config_hash(pod)
    return out


def leader_worker_set(
    spec: DisaggregatedServingSpec, role: EngineRole, metadata: dict[str, Any], template: dict[str, Any]
) -> dict[str, Any]:
    """The role's LeaderWorkerSet: `replicas` groups of nodesPerInstance pods, from the role's engine pod
    `template`. A group starts its workers once its leader is Ready (LeaderReady), is recreated whole when one of its
    pods restarts (a lost rank breaks the instance), and rolls by the role's rollout bounds counted in groups."""
    rollout = role.spec.rollout
    meta = copy.deepcopy(metadata)
    if role.spec.instance_topology_key:
        meta["annotations"] = {EXCLUSIVE_TOPOLOGY_ANNOTATION: role.spec.instance_topology_key}
    return LEADER_WORKER_SET.manifest(
        meta,
        spec={
            "replicas": role.spec.replicas,
            "startupPolicy": "LeaderCreated",
            "rolloutStrategy": {
                "type": "RollingUpdate",
                "rollingUpdateConfiguration": {
                    "maxSurge": rollout.max_surge,
                    "maxUnavailable": rollout.max_unavailable,
                },
            },
            "leaderWorkerTemplate": {
                "size": role.spec.nodes_per_instance,
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": _rank_template(spec, role, template, leader=True),
                "workerTemplate": _rank_template(spec, role, template, leader=False),
            },
        },
    )

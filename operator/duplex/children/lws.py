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
from collections.abc import Mapping
from typing import Any

from duplex.children.kinds import LEADER_WORKER_SET
from duplex.children.labels import ENGINE_HASH_ANNOTATION, config_hash
from duplex.children.roles import EngineRole

WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"  # "0" on the leader
GROUP_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/group-index"  # the instance
EXCLUSIVE_TOPOLOGY_ANNOTATION = "leaderworkerset.sigs.k8s.io/exclusive-topology"
LEADER_SELECTOR = {WORKER_INDEX_LABEL: "0"}  # added to the role Service's selector: routers see leaders only
# How the ranks find their leader (LWS_LEADER_ADDRESS, <leader pod>.<subdomain>.<namespace>): through a headless
# Service of each group, named after its leader pod, that LWS creates publishing not-ready pods. LWS's default
# (Shared) would name one for the whole set after the set, that is after the role Service: LWS would find that name
# taken and create none, and the ranks would look their leader up through the role Service, which publishes it
# only once it is Ready, and it is Ready only once every rank has joined it.
SUBDOMAIN_POLICY = "UniquePerReplica"
# What a headless rank does without: it serves no HTTP (nothing to probe; its leader drains the instance, and the
# rank's own hook only holds it while the leader answers) and no NIXL handshake (vLLM's scheduler, on the leader,
# serves the handshake of every rank).
_LEADER_ONLY = ("ports", "startupProbe", "readinessProbe", "livenessProbe", "lifecycle")


def rank_templates(lws: Mapping[str, Any]) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """The (leader, worker) pod templates of a LeaderWorkerSet."""
    group = (lws.get("spec") or {}).get("leaderWorkerTemplate") or {}
    return group.get("leaderTemplate"), group.get("workerTemplate")


def launch_args(role: EngineRole, leader: bool) -> list[str]:
    """vLLM's multi-node launch, after the engine's own arguments (the owned flags: api/owned_args.py)."""
    args = [
        "--distributed-executor-backend", "mp",
        "--nnodes", str(role.spec.nodes_per_instance),
        "--node-rank", "0" if leader else "$(LWS_WORKER_INDEX)",
        "--master-addr", "$(LWS_LEADER_ADDRESS)",
    ]  # fmt: skip
    return args if leader else [*args, "--headless"]


def _rank_template(
    role: EngineRole, template: dict[str, Any], leader: bool, worker_pre_stop: dict[str, Any] | None = None
) -> dict[str, Any]:
    out = copy.deepcopy(template)
    pod = out["spec"]
    engine = next(c for c in pod["containers"] if c["name"] == "vllm")
    engine["args"] = [*engine["args"], *launch_args(role, leader)]
    if not leader:
        for key in _LEADER_ONLY:
            engine.pop(key, None)
        if worker_pre_stop is not None:
            engine["lifecycle"] = {"preStop": worker_pre_stop}
    out["metadata"]["annotations"][ENGINE_HASH_ANNOTATION] = config_hash(pod)
    return out


def leader_worker_set(
    role: EngineRole,
    metadata: dict[str, Any],
    template: dict[str, Any],
    replicas: dict[str, int],
    worker_pre_stop: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The role's LeaderWorkerSet: groups of nodesPerInstance pods, from the role's engine pod `template`; `replicas`:
    {"replicas": groups}, or {} when another writer owns them (scaling.mode External). A group starts its workers as
    soon as its leader exists (LeaderCreated: the leader is Ready only once every rank has joined it), is recreated
    whole when one of its pods restarts (a lost rank breaks the instance), finds its leader through a Service of its own
    (SUBDOMAIN_POLICY), and rolls by the role's rollout bounds counted in groups. `worker_pre_stop`: the workers' hook
    (lifecycle.worker_pre_stop), which keeps a group that goes as a unit whole while its leader drains."""
    rollout = role.spec.rollout
    meta = copy.deepcopy(metadata)
    if role.spec.instance_topology_key:
        meta["annotations"] = {EXCLUSIVE_TOPOLOGY_ANNOTATION: role.spec.instance_topology_key}
    return LEADER_WORKER_SET.manifest(
        meta,
        spec={
            **replicas,
            "startupPolicy": "LeaderCreated",
            "networkConfig": {"subdomainPolicy": SUBDOMAIN_POLICY},
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
                "leaderTemplate": _rank_template(role, template, leader=True),
                "workerTemplate": _rank_template(role, template, leader=False, worker_pre_stop=worker_pre_stop),
            },
        },
    )

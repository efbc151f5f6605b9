"""Prefill and decode of a new KV revision become Ready together.

Each engine pod of a revision has the readiness gate `duplex.dev/kv-paired` (duplex/revision.py): the kubelet calls
it Ready only once its containers are ready and the operator has set that condition. A pass opens a role's gates
only as far as the other role has come: of a role's N replicas, at most ceil(N x the share of the other role's
replicas whose containers are ready), and never before one pod of the other role is. The Deployment controller
replaces an old pod only when a new one is available (maxUnavailable 0), so the old revision loses prefill and
decode pods at the same pace and keeps at least one of each until the new one is whole: no moment has a revision
with prefill but no decode. The router sends each turn to one revision (the one the role Services name once it has
both roles Ready), so the old pods still serve the turns of the old revision until they go.

A role whose instances span nodes counts instances by their leaders: only a leader has the gate, and its containers
are ready only once every rank of its instance has joined it.

Once the other role has all its replicas' containers ready, every ready pod opens: a KV-compatible roll's surge pods
and a scale-up open at once. Pure: pods in, status patches
out; the gates are derived from the pods on every pass (no rollout state is kept anywhere).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from duplex.children.kinds import POD
from duplex.children.labels import KV_REVISION_LABEL, ROLE_LABEL, SERVING_LABEL
from duplex.children.lws import WORKER_INDEX_LABEL
from duplex.revision import ENGINE_ROLES, GATE


def _condition(pod: Mapping[str, Any], kind: str) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == kind and c.get("status") == "True" for c in conditions)


def _members(serving: str, rev: str, pods: Sequence[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    """The revision's pods by role, not on their way out, in name order; of a multi-node instance its leader."""
    out: dict[str, list[Mapping[str, Any]]] = {role: [] for role in ENGINE_ROLES}
    for pod in sorted(pods, key=lambda p: str((p.get("metadata") or {}).get("name"))):
        meta = pod.get("metadata") or {}
        labels = meta.get("labels") or {}
        if (
            labels.get(SERVING_LABEL) != serving
            or labels.get(KV_REVISION_LABEL) != rev
            or meta.get("deletionTimestamp")
            or labels.get(WORKER_INDEX_LABEL, "0") != "0"
        ):
            continue
        role = labels.get(ROLE_LABEL)
        if role in out:
            out[role].append(pod)
    return out


def allowed(replicas: int, other_ready: int, other_replicas: int) -> int:
    """How many of a role's pods may be Ready, given how many of the other role's are (containers ready)."""
    if other_replicas <= 0:
        return replicas
    if other_ready <= 0:
        return 0
    return max(1, math.ceil(replicas * min(1.0, other_ready / other_replicas)))


def gate_patches(
    serving: str, rev: str, replicas: Mapping[str, int], pods: Sequence[Mapping[str, Any]], at: str
) -> list[dict[str, Any]]:
    """Status patches (minimal Pod objects) that set the gate on the revision's pods whose turn has come."""
    if not rev:
        return []  # pods from before revisions have no gate
    members = _members(serving, rev, pods)
    ready = {role: sum(_condition(p, "ContainersReady") for p in members[role]) for role in ENGINE_ROLES}
    patches = []
    for role in ENGINE_ROLES:
        other = "decode" if role == "prefill" else "prefill"
        whole = ready[other] >= replicas.get(other, 1)  # then nothing to wait for: a compatible roll's surge pods
        limit = (
            ready[role]
            if whole
            else min(ready[role], allowed(replicas.get(role, 1), ready[other], replicas.get(other, 1)))
        )
        opened = sum(_condition(p, GATE) for p in members[role])
        for pod in members[role]:
            if opened >= limit:
                break
            if _condition(pod, GATE) or not _condition(pod, "ContainersReady"):
                continue
            opened += 1
            message = f"{ready[other]} {other} pod(s) of KV revision {rev} are ready"
            condition = {"type": GATE, "status": "True", "reason": "Paired", "message": message}
            meta = pod.get("metadata") or {}
            patches.append(
                POD.manifest(
                    {"name": meta.get("name"), "namespace": meta.get("namespace")},
                    status={"conditions": [{**condition, "lastTransitionTime": at}]},
                )
            )
    return patches

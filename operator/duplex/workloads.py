"""The workloads status reads (prefill, decode, router), the same way for both kinds a role may be: a Deployment
counts pods; the LeaderWorkerSet of a role whose instances span nodes counts instances (groups of pods), one ready
when its leader and every worker are (LWS's status.readyReplicas). Pure: observed objects in, counts out."""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from duplex.children.kinds import DEPLOYMENT, LEADER_WORKER_SET, WORKLOAD_KINDS, ChildKind
from duplex.children.labels import ROLE_LABEL, SERVING_LABEL, child_name
from duplex.children.lws import GROUP_INDEX_LABEL, WORKER_INDEX_LABEL
from duplex.children.roles import EngineRole
from duplex.converge import key
from duplex.render import Serving

WORKLOADS = ("prefill", "decode", "router")

# The Deployment controller's reasons on its Progressing condition while a rollout (a first start too) goes on and
# is within progressDeadlineSeconds; NewReplicaSetAvailable means it completed, ProgressDeadlineExceeded (with status
# False) that it failed.
_IN_PROGRESS = frozenset({"NewReplicaSetCreated", "FoundNewReplicaSet", "ReplicaSetUpdated"})


def kind(serving: Serving, workload: str) -> ChildKind:
    """The kind the workload is rendered as."""
    if workload != "router" and EngineRole.of(serving.spec, workload).multinode:
        return LEADER_WORKER_SET
    return DEPLOYMENT


def observed(serving: Serving, objs: Sequence[Mapping[str, Any]]) -> dict[str, Mapping[str, Any] | None]:
    """Each workload as the watch last saw it, of the kind the spec renders it as: a role that changes kind reads as
    missing until its new workload exists."""
    by_key = {key(dict(o)): o for o in objs}
    out: dict[str, Mapping[str, Any] | None] = {}
    for workload in WORKLOADS:
        k = kind(serving, workload)
        out[workload] = by_key.get((k.api_version, k.kind, child_name(serving.name, workload)))
    return out


def replaced(serving: Serving, to_delete: Sequence[Mapping[str, Any]]) -> list[tuple[str, Mapping[str, Any]]]:
    """(role, workload) for each engine workload deleted because its role is now rendered as the other kind
    (nodesPerInstance moved between 1 and more): the role has no pods of its own until its new workload's are Ready."""
    out = []
    for obj in to_delete:
        for role in ("prefill", "decode"):
            named = (obj.get("metadata") or {}).get("name") == child_name(serving.name, role)
            if (
                named
                and obj.get("kind") in {k.kind for k in WORKLOAD_KINDS}
                and obj.get("kind") != kind(serving, role).kind
            ):
                out.append((role, obj))
    return out


@dataclass(frozen=True)
class Progress:
    """A workload's counts in its own unit: pods of a Deployment, instances of a LeaderWorkerSet."""

    kind: str  # named in messages
    unit: str  # "pods" or "instances"
    exists: bool
    ready: int
    updated: int  # on the current template; none while the controller has not seen the current spec
    outdated: int  # still on an old template: during a surge roll the counts can look complete while these serve
    starting: bool  # not ready yet and within the progress deadline: starting, not failing


def progress(k: ChildKind, obj: Mapping[str, Any] | None, at: str, deadline_seconds: int | None) -> Progress:
    """The counts of `obj`, a workload of kind `k` (None: it does not exist). `deadline_seconds`: the role's
    rollout.progressDeadlineSeconds, which a Deployment applies itself and a LeaderWorkerSet does not know."""
    unit = "instances" if k is LEADER_WORKER_SET else "pods"
    if obj is None:
        return Progress(k.kind, unit, exists=False, ready=0, updated=0, outdated=0, starting=False)
    st = obj.get("status") or {}
    generation = (obj.get("metadata") or {}).get("generation")
    if k is LEADER_WORKER_SET:
        # LWS releases before status.observedGeneration leave it out: their counts are taken as current.
        current = "observedGeneration" not in st or generation is None or st["observedGeneration"] >= generation
        starting = not current or _lws_progressing(st, at, deadline_seconds)
    else:
        current = (st.get("observedGeneration") or 0) >= (generation or 1)
        starting = _deployment_starting(st, generation)
    total, updated = st.get("replicas") or 0, st.get("updatedReplicas") or 0
    return Progress(
        k.kind,
        unit,
        exists=True,
        ready=st.get("readyReplicas") or 0,
        updated=updated if current else 0,
        outdated=max(0, total - updated),
        starting=starting,
    )


def _deployment_starting(st: Mapping[str, Any], generation: int | None) -> bool:
    """A pod that breaks after the rollout completed is not starting (the controller leaves NewReplicaSetAvailable
    in place)."""
    if generation is not None and (st.get("observedGeneration") or 0) < generation:
        return True  # the controller has not looked at this spec yet
    progressing = _condition(st, "Progressing")
    return progressing.get("status") == "True" and progressing.get("reason") in _IN_PROGRESS


def _lws_progressing(st: Mapping[str, Any], at: str, deadline_seconds: int | None) -> bool:
    """LWS's Progressing condition is True while any group is not ready, with no deadline of its own (a group that
    breaks is recreated whole, so it starts again): starting while it has been True for less than the deadline."""
    progressing = _condition(st, "Progressing")
    if progressing.get("status") != "True":
        return False
    since = progressing.get("lastTransitionTime")
    if deadline_seconds is None or not isinstance(since, str):
        return True
    try:
        return (_time(at) - _time(since)).total_seconds() < deadline_seconds
    except ValueError:
        return True  # a time we cannot read says nothing of the deadline


def _condition(st: Mapping[str, Any], ctype: str) -> Mapping[str, Any]:
    return next((c for c in st.get("conditions") or [] if c.get("type") == ctype), {})


def _time(stamp: str) -> datetime.datetime:
    return datetime.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC)


NAMED_AT_MOST = 5  # ranks named in a condition message


def ranks_not_ready(serving: str, role: str, pods: Sequence[Mapping[str, Any]]) -> list[str]:
    """The pods of a multi-node role's groups that run but are not Ready, each with its group and rank, as
    "<pod> (instance G rank R)", instance then rank order; terminating pods are left out (their group is going)."""
    found = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        labels = meta.get("labels") or {}
        if labels.get(SERVING_LABEL) != serving or labels.get(ROLE_LABEL) != role or meta.get("deletionTimestamp"):
            continue
        group, rank = labels.get(GROUP_INDEX_LABEL), labels.get(WORKER_INDEX_LABEL)
        if group is None or rank is None:
            continue
        ready = _condition(pod.get("status") or {}, "Ready").get("status") == "True"
        if not ready:
            found.append((int(group), int(rank), f"{meta.get('name')} (instance {group} rank {rank})"))
    return [name for *_, name in sorted(found)]

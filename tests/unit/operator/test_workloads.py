"""Status of a role whose instances span nodes, read from its LeaderWorkerSet (workloads.py): ready instances from
LWS's status.readyReplicas (groups whose leader and every worker are ready), rolling while groups are on an old
template, starting within the role's progress deadline; and the sync core keeping the set, like the Deployments,
until the engine key exists. The LWS status objects follow leaderworkerset.x-k8s.io/v1's LeaderWorkerSetStatus."""

from __future__ import annotations

from typing import Any

import pytest
from dsv_helpers import children, serving
from sync_helpers import KEY_UID, T1, observed, parent

from duplex import status, workloads
from duplex.children.kinds import DEPLOYMENT, LEADER_WORKER_SET
from duplex.sync import sync

MULTINODE = {
    "network": {"efa": {"enabled": True}},
    "prefill": {"memory": "1Gi"},
    "decode": {"memory": "1Gi", "replicas": 2, "nodesPerInstance": 2, "tensorParallelSize": 8},
}
AT = "2026-01-01T01:00:00Z"
A_MINUTE_AGO, AN_HOUR_AGO = "2026-01-01T00:59:00Z", "2026-01-01T00:00:00Z"


def lws_status(
    ready: int,
    updated: int | None = None,
    total: int | None = None,
    progressing_since: str | None = None,
    observed_generation: int | None = 1,
) -> dict[str, Any]:
    """A LeaderWorkerSet at generation 1, as its controller reports it: counts of groups, and Available or
    Progressing (with UpdateInProgress while groups are on an old template)."""
    updated = ready if updated is None else updated
    total = max(ready, updated) if total is None else total
    if progressing_since is None:
        conditions = [{"type": "Available", "status": "True", "reason": "AllGroupsReady", "lastTransitionTime": AT}]
    else:
        conditions = [
            {"type": "Available", "status": "False", "reason": "AllGroupsReady", "lastTransitionTime": AT},
            {
                "type": "Progressing",
                "status": "True",
                "reason": "GroupsProgressing",
                "message": "Replicas are progressing",
                "lastTransitionTime": progressing_since,
            },
        ]
        if updated < total:
            conditions.append(
                {"type": "UpdateInProgress", "status": "True", "reason": "GroupsUpdating", "lastTransitionTime": AT}
            )
    st: dict[str, Any] = {
        "readyReplicas": ready,
        "updatedReplicas": updated,
        "replicas": total,
        "hpaPodSelector": "leaderworkerset.sigs.k8s.io/name=demo-decode,leaderworkerset.sigs.k8s.io/worker-index=0",
        "conditions": conditions,
    }
    if observed_generation is not None:
        st["observedGeneration"] = observed_generation
    return st


def live_children(decode_status: dict[str, Any]) -> list[dict[str, Any]]:
    """The serving's children as the watch delivers them, the decode LeaderWorkerSet with `decode_status`."""
    objs = observed(parent(MULTINODE))
    for o in objs:
        if o["kind"] == "LeaderWorkerSet":
            o["metadata"]["generation"] = 1
            o["status"] = decode_status
    return objs


def decode_condition(decode_status: dict[str, Any]) -> dict[str, Any]:
    st = status.patch_body(sync(parent(MULTINODE), live_children(decode_status), None, at=AT).status)
    return next(c for c in st["conditions"] if c["type"] == "DecodeReady")


# --- which workload status reads ------------------------------------------------------------------------------


def test_a_multinode_role_is_read_from_its_leader_worker_set() -> None:
    s = serving(MULTINODE)
    assert [workloads.kind(s, w) for w in workloads.WORKLOADS] == [DEPLOYMENT, LEADER_WORKER_SET, DEPLOYMENT]
    read = workloads.observed(s, children(MULTINODE))
    assert {w: o["kind"] if o else None for w, o in read.items()} == {
        "prefill": "Deployment",
        "decode": "LeaderWorkerSet",
        "router": "Deployment",
    }


def test_a_role_changing_kind_reads_as_missing_until_its_new_workload_exists() -> None:
    single = [o for o in children() if o["kind"] == "Deployment"]  # decode still a Deployment
    assert workloads.observed(serving(MULTINODE), single)["decode"] is None


# --- DecodeReady from the LeaderWorkerSet -----------------------------------------------------------------------


def test_every_instance_ready_is_ready_and_counts_instances() -> None:
    result = sync(parent(MULTINODE), live_children(lws_status(ready=2)), None, at=AT)
    st = status.patch_body(result.status)
    assert st["decode"] == {"replicas": 2, "readyReplicas": 2, "updatedReplicas": 2, "summary": "2/2"}
    c = {x["type"]: x for x in st["conditions"]}
    assert (c["DecodeReady"]["status"], c["DecodeReady"]["reason"]) == ("True", "AllReplicasReady")
    assert c["DecodeReady"]["message"] == "2/2 decode instances ready"
    assert (c["Ready"]["status"], c["Progressing"]["status"]) == ("True", "False")


@pytest.mark.parametrize(
    ("decode_status", "reason", "message"),
    [
        # One group has a pod that is not ready (LWS counts the group as not ready): starting, within the deadline.
        (lws_status(ready=1, updated=2, progressing_since=A_MINUTE_AGO), "Starting", "1/2 decode instances ready"),
        # Still not ready after the role's progressDeadlineSeconds (600 s): failing.
        (lws_status(ready=1, updated=2, progressing_since=AN_HOUR_AGO), "ReplicasNotReady", "1/2 decode instances"),
        # A roll with maxSurge 1: a third group on the new template, two on the old one, all ready.
        (lws_status(ready=3, updated=1, total=3, progressing_since=A_MINUTE_AGO), "RollingOut", "2 old still running"),
    ],
)
def test_an_instance_not_ready_or_not_updated_is_not_ready(
    decode_status: dict[str, Any], reason: str, message: str
) -> None:
    c = decode_condition(decode_status)
    assert (c["status"], c["reason"]) == ("False", reason)
    assert message in c["message"]


def test_a_set_its_controller_has_not_seen_yet_counts_no_instance_as_updated() -> None:
    p = workloads.progress(LEADER_WORKER_SET, {"metadata": {"generation": 2}, "status": lws_status(ready=2)}, AT, 600)
    assert (p.ready, p.updated, p.starting) == (2, 0, True)


def test_without_observed_generation_the_counts_are_taken_as_current() -> None:
    """LWS releases before status.observedGeneration report counts only."""
    obj = {"metadata": {"generation": 5}, "status": lws_status(ready=2, observed_generation=None)}
    p = workloads.progress(LEADER_WORKER_SET, obj, AT, 600)
    assert (p.unit, p.ready, p.updated, p.outdated, p.starting) == ("instances", 2, 2, 0, False)


def test_a_set_without_status_is_not_ready() -> None:
    c = decode_condition({})
    assert (c["status"], c["reason"]) == ("False", "ReplicasNotReady")
    assert c["message"] == "0/2 decode instances ready, 0 updated"


def test_a_missing_set_is_not_created() -> None:
    objs = [o for o in live_children(lws_status(ready=2)) if o["kind"] != "LeaderWorkerSet"]
    st = status.patch_body(sync(parent(MULTINODE), objs, None, at=AT).status)
    c = next(c for c in st["conditions"] if c["type"] == "DecodeReady")
    assert (c["reason"], c["message"]) == ("NotCreated", "decode LeaderWorkerSet does not exist yet")


# --- the engine key ---------------------------------------------------------------------------------------------


def test_the_leader_worker_set_waits_for_the_engine_key_like_the_deployments() -> None:
    without_key = [o for o in live_children(lws_status(ready=2)) if o["kind"] not in ("Secret", "LeaderWorkerSet")]
    waiting = sync(parent(MULTINODE), without_key, None, at=T1)
    assert [o["kind"] for o in waiting.create] == ["Secret"]
    assert not [o for o in waiting.apply if o["kind"] in ("Deployment", "LeaderWorkerSet")]
    # Once the key exists the set goes out, its pods stamped with the key's uid.
    with_key = [o for o in live_children(lws_status(ready=2)) if o["kind"] != "LeaderWorkerSet"]
    (lws,) = [o for o in sync(parent(MULTINODE), with_key, None, at=T1).apply if o["kind"] == "LeaderWorkerSet"]
    for rank in ("leaderTemplate", "workerTemplate"):
        annotations = lws["spec"]["leaderWorkerTemplate"][rank]["metadata"]["annotations"]
        assert annotations["duplex.dev/engine-key-uid"] == KEY_UID


def rank_pod(group: int, rank: int, ready: bool, going: bool = False) -> dict[str, Any]:
    """A pod of the decode LeaderWorkerSet's group `group`, as the pod watch delivers it (LWS's labels)."""
    name = f"demo-decode-{group}" + (f"-{rank}" if rank else "")
    meta: dict[str, Any] = {
        "name": name,
        "namespace": "default",
        "labels": {
            "duplex.dev/serving": "demo",
            "duplex.dev/role": "decode",
            "leaderworkerset.sigs.k8s.io/group-index": str(group),
            "leaderworkerset.sigs.k8s.io/worker-index": str(rank),
        },
    }
    if going:
        meta["deletionTimestamp"] = AT
    ready_condition = {"type": "Ready", "status": "True" if ready else "False"}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "status": {"conditions": [ready_condition]}}


def test_a_role_not_ready_names_its_ranks_not_ready() -> None:
    pods = [rank_pod(0, 0, True), rank_pod(0, 1, True), rank_pod(1, 0, False), rank_pod(1, 1, False)]
    pods.append(rank_pod(2, 1, False, going=True))  # a group going as a unit: not named
    objs = live_children(lws_status(ready=1, updated=2, progressing_since=A_MINUTE_AGO)) + pods
    st = status.patch_body(sync(parent(MULTINODE), objs, None, at=AT).status)
    c = next(x for x in st["conditions"] if x["type"] == "DecodeReady")
    assert c["message"] == (
        "1/2 decode instances ready, within the progress deadline; "
        "not ready: demo-decode-1 (instance 1 rank 0), demo-decode-1-1 (instance 1 rank 1)"
    )
    many = [rank_pod(g, r, False) for g in range(4) for r in range(2)]
    assert workloads.ranks_not_ready("demo", "decode", many)[:2] == [
        "demo-decode-0 (instance 0 rank 0)",
        "demo-decode-0-1 (instance 0 rank 1)",
    ]
    objs = live_children(lws_status(ready=0, updated=2, progressing_since=A_MINUTE_AGO)) + many
    c = next(
        x
        for x in status.patch_body(sync(parent(MULTINODE), objs, None, at=AT).status)["conditions"]
        if x["type"] == "DecodeReady"
    )
    assert c["message"].endswith("demo-decode-2 (instance 2 rank 0) and 3 more")

"""A role whose instances span nodes goes through the lifecycle as a single-node role does, counted in instances:
KV revisions stamped on both ranks with the readiness gate on the leader, lockstep by leaders, the replicas writers
(Fixed, External, Automatic) on the LeaderWorkerSet, and no pod-deletion cost where LWS picks what goes."""

from __future__ import annotations

import copy
from typing import Any

from sync_helpers import READY, T1, RecordingKube, observed, parent, refs
from test_multinode import TWO_NODES, engine, ranks

from duplex import revision
from duplex.reconcile import reconcile_once
from duplex.render import desired_children, parse
from duplex.replicas import HANDOVER
from duplex.sync import sync

LWS = "LeaderWorkerSet/demo-decode"


def workload(objs: list[dict[str, Any]], ref: str) -> dict[str, Any]:
    kind, name = ref.split("/")
    (obj,) = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    return obj


def with_decode(**fields: Any) -> dict[str, Any]:
    return {**TWO_NODES, "decode": {**TWO_NODES["decode"], **fields}}


def engine_pod(name: str, role: str, rev: str, rank: str | None = None, ready: bool = True) -> dict[str, Any]:
    labels = {"duplex.dev/serving": "demo", "duplex.dev/role": role, "duplex.dev/kv-revision": rev}
    if rank is not None:
        labels |= {"leaderworkerset.sigs.k8s.io/worker-index": rank, "leaderworkerset.sigs.k8s.io/group-index": "0"}
    status = "True" if ready else "False"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "ns1", "labels": labels},
        "status": {"conditions": [{"type": "ContainersReady", "status": status}], "podIP": "198.18.0.9"},
    }


def lws_scaled_to(objs: list[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    objs = copy.deepcopy(objs)
    workload(objs, LWS)["spec"]["replicas"] = n
    return objs


# --- KV revisions -----------------------------------------------------------------------------------------------


def test_both_ranks_carry_the_revision_and_only_the_leader_waits_for_the_gate() -> None:
    objs = desired_children(parse(parent(TWO_NODES)))
    lws = workload(objs, LWS)
    rev = revision.of_template(workload(objs, "Deployment/demo-prefill")["spec"]["template"])
    assert rev and revision.of_template(revision.engine_template(lws)) == rev
    for rank in ("leader", "worker"):
        template = ranks(lws, rank)
        assert template["metadata"]["labels"]["duplex.dev/kv-revision"] == rev
        assert {"name": "DUPLEX_KV_REVISION", "value": rev} in engine(template)["env"]
    assert ranks(lws, "leader")["spec"]["readinessGates"] == [{"conditionType": "duplex.dev/kv-paired"}]
    assert "readinessGates" not in ranks(lws, "worker")["spec"]  # the leader is Ready only with every rank
    assert workload(objs, "Service/demo-decode")["metadata"]["labels"]["duplex.dev/kv-revision"] == rev


def test_a_new_pipeline_split_is_a_kv_incompatible_change_that_rolls_both_roles() -> None:
    live = observed(parent(TWO_NODES))
    before = revision.of_template(revision.engine_template(workload(live, LWS)))
    changed = with_decode(nodesPerInstance=4, pipelineParallelSize=4, accelerator={"count": 8})
    changed["decode"]["tensorParallelSize"] = 8
    result = sync(parent(changed), live, READY, at=T1)
    assert result.status.engine_change is not None
    assert result.status.engine_change.kv == "Incompatible"
    assert "pipelineParallelSize" in result.status.engine_change.fields
    applied = {f"{o['kind']}/{o['metadata']['name']}": o for o in result.apply}
    revs = {revision.of_template(revision.engine_template(applied[r])) for r in (LWS, "Deployment/demo-prefill")}
    assert len(revs) == 1 and revs != {before}


def test_a_compatible_change_to_the_ranks_keeps_the_revision() -> None:
    live = observed(parent(TWO_NODES))
    result = sync(parent(with_decode(memory="2Gi")), live, READY, at=T1)
    assert refs(result.apply) == [LWS]
    assert result.status.engine_change is not None and result.status.engine_change.kv == "Compatible"


def test_a_pass_opens_the_gate_of_the_leader_once_prefill_is_ready() -> None:
    live = observed(parent(TWO_NODES))
    rev = revision.of_template(revision.engine_template(workload(live, LWS))) or ""
    leader, worker = engine_pod("decode-0", "decode", rev, "0"), engine_pod("decode-0-1", "decode", rev, "1")
    waiting = sync(parent(TWO_NODES), [*live, leader, worker, engine_pod("p", "prefill", rev, ready=False)], READY, T1)
    assert waiting.gates == []  # the instance's leader waits for a ready prefill pod
    pods = [leader, worker, engine_pod("p", "prefill", rev)]
    opened = sync(parent(TWO_NODES), [*live, *pods], READY, at=T1)
    assert sorted(p["metadata"]["name"] for p in opened.gates) == ["decode-0", "p"]


# --- who writes replicas: instances of the LeaderWorkerSet ---------------------------------------------------------


def test_an_external_role_leaves_the_instances_to_its_autoscaler_after_a_handover() -> None:
    external = parent(with_decode(replicas=2, scaling={"mode": "External"}))
    assert "replicas" not in workload(desired_children(parse(external), "uid"), LWS)["spec"]
    live = lws_scaled_to(observed(parent(with_decode(replicas=2))), 3)
    result = sync(external, live, READY, at=T1)
    (handover,) = result.handover
    assert handover.before_apply and handover.workload["kind"] == "LeaderWorkerSet"
    assert handover.workload["spec"] == {"replicas": 3}  # its live value: the switch scales nothing
    kube = RecordingKube(exists=True)
    reconcile_once(kube, {**external, "status": READY}, live)  # type: ignore[arg-type]
    assert [c for c in kube.calls if c[1] == LWS] == [(f"hand_over:{HANDOVER}", LWS), ("apply", LWS)]


def test_a_fixed_role_sets_back_instances_another_writer_changed() -> None:
    fixed = parent(with_decode(replicas=2))
    result = sync(fixed, lws_scaled_to(observed(fixed), 5), READY, at=T1)
    assert workload(result.apply, LWS)["spec"]["replicas"] == 2
    warnings = [e for e in result.events if e.reason == "ReplicasOverwritten"]
    assert len(warnings) == 1 and "scaled to 5" in warnings[0].message


def test_the_planner_sizes_instances() -> None:
    automatic = with_decode(replicas=1, maxNumSeqs=64, scaling={"mode": "Automatic", "maxReplicas": 4})
    objs = desired_children(parse(parent(automatic)), "uid", planned={"decode": 3})
    assert workload(objs, LWS)["spec"]["replicas"] == 3


def test_no_deletion_cost_where_lws_picks_the_instances_that_go() -> None:
    fixed = parent(with_decode(replicas=1))
    live = lws_scaled_to(observed(fixed), 2)
    rev = revision.of_template(revision.engine_template(workload(live, LWS))) or ""
    result = sync(fixed, [*live, engine_pod("decode-1", "decode", rev, "0")], READY, at=T1)
    assert workload(result.apply, LWS)["spec"]["replicas"] == 1 and result.annotate == []


def test_a_role_that_changes_kind_says_its_pods_go_at_once() -> None:
    single = parent()
    live = observed(single)
    result = sync(parent(TWO_NODES), live, READY, at=T1)
    assert "Deployment/demo-decode" in refs(result.delete) and LWS in refs(result.apply)
    (warning,) = [e for e in result.events if e.reason == "WorkloadReplaced"]
    assert warning.type == "Warning"
    assert warning.message.startswith("Deployment/demo-decode goes: spec.decode.nodesPerInstance makes the role a ")
    assert "serves nothing until the new instances are Ready" in warning.message
    # and a pass that changes nothing of the kind says nothing of it
    assert not [
        e
        for e in sync(parent(TWO_NODES), observed(parent(TWO_NODES)), READY, at=T1).events
        if e.reason == "WorkloadReplaced"
    ]

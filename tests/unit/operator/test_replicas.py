"""One writer of each role's replicas: Fixed roles are the operator's (set back, with a Warning, when someone else
scales them); External roles are an autoscaler's, and the operator hands the field over at its live value before the
first apply that leaves it out, so that a switch of mode scales nothing."""

from __future__ import annotations

from typing import Any

from sync_helpers import LIVE, READY, T1, RecordingKube, edit, observed, parent, refs

from duplex.reconcile import reconcile_once
from duplex.render import desired_children, parse
from duplex.replicas import HANDOVER
from duplex.sync import sync

EXTERNAL = {"scaling": {"mode": "External"}}


def decode_deployment(objs: list[dict[str, Any]]) -> dict[str, Any]:
    (deploy,) = [o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"] == "demo-decode"]
    return deploy


def scaled_to(n: int) -> Any:
    def scale(deploy: dict[str, Any]) -> None:
        deploy["spec"]["replicas"] = n
        deploy["status"].update(replicas=n, updatedReplicas=n, readyReplicas=n, availableReplicas=n)

    return scale


def test_a_fixed_role_applies_its_replicas_an_external_role_leaves_them_out() -> None:
    fixed = decode_deployment(desired_children(parse(parent({"decode": {"replicas": 3}})), "uid"))
    external = decode_deployment(desired_children(parse(parent({"decode": {"replicas": 3, **EXTERNAL}})), "uid"))
    assert fixed["spec"]["replicas"] == 3
    assert "replicas" not in external["spec"]


def test_switching_to_external_hands_replicas_over_at_their_live_value_before_the_apply() -> None:
    fixed = parent({"decode": {"replicas": 3}})
    live = observed(fixed)
    external = parent({"decode": {"replicas": 3, **EXTERNAL}})
    result = sync(external, live, READY, at=T1)
    assert "Deployment/demo-decode" in refs(result.apply)
    (handover,) = result.handover
    assert handover.before_apply and handover.workload["spec"] == {"replicas": 3}
    assert handover.workload["metadata"] == {"name": "demo-decode", "namespace": "ns1"}

    kube = RecordingKube(exists=True)
    reconcile_once(kube, {**external, "status": READY}, live)  # type: ignore[arg-type]
    calls = [c for c in kube.calls if c[1] == "Deployment/demo-decode"]
    assert calls == [(f"hand_over:{HANDOVER}", "Deployment/demo-decode"), ("apply", "Deployment/demo-decode")]


def test_an_external_role_is_created_then_given_its_starting_size() -> None:
    external = parent({"decode": {"replicas": 2, **EXTERNAL}})
    live = [o for o in observed(external) if o["metadata"]["name"] != "demo-decode" or o["kind"] != "Deployment"]
    (handover,) = sync(external, live, READY, at=T1).handover
    assert not handover.before_apply and handover.workload["spec"] == {"replicas": 2}

    kube = RecordingKube(exists=True)
    reconcile_once(kube, {**external, "status": READY}, live)  # type: ignore[arg-type]
    calls = [c for c in kube.calls if c[1] == "Deployment/demo-decode"]
    assert calls == [("apply", "Deployment/demo-decode"), (f"hand_over:{HANDOVER}", "Deployment/demo-decode")]


def test_what_an_autoscaler_set_stands_and_is_the_roles_size_in_status() -> None:
    external = parent({"decode": EXTERNAL})
    live = edit(observed(external), "Deployment/demo-decode", scaled_to(5))
    result = sync(external, live, READY, at=T1)
    assert result.apply == [] and result.handover == []
    assert result.status.decode.replicas == 5 and result.status.decode.summary == "5/5"
    assert not [e for e in result.events if e.reason == "ReplicasOverwritten"]


def test_a_template_change_of_an_external_role_keeps_the_autoscalers_size() -> None:
    external = parent({"decode": EXTERNAL})
    live = edit(observed(external), "Deployment/demo-decode", scaled_to(4))
    changed = parent({"decode": {**EXTERNAL, "maxNumSeqs": 64}})
    (handover,) = sync(changed, live, READY, at=T1).handover
    assert handover.before_apply and handover.workload["spec"] == {"replicas": 4}


def test_a_fixed_role_scaled_by_someone_else_goes_back_with_a_warning() -> None:
    live = edit(LIVE, "Deployment/demo-decode", scaled_to(4))
    result = sync(parent(), live, READY, at=T1)
    assert decode_deployment(result.apply)["spec"]["replicas"] == 1
    (event,) = [e for e in result.events if e.reason == "ReplicasOverwritten"]
    assert event.type == "Warning"
    assert "demo-decode was scaled to 4" in event.message and "back to 1" in event.message
    assert "External" in event.message
    assert result.handover == []


def test_a_spec_change_of_replicas_is_no_overwrite() -> None:
    result = sync(parent({"decode": {"replicas": 2}}), LIVE, READY, at=T1)
    assert decode_deployment(result.apply)["spec"]["replicas"] == 2
    assert not [e for e in result.events if e.reason == "ReplicasOverwritten"]

"""router.inferencePool: an InferencePool (Gateway API Inference Extension v1) of the serving's router pods, and
llm-d's role label on the engine pods, both only when enabled; what the spec accepts; and how the sync core applies,
keeps and prunes the pool. (tests/integration/test_inference_pool.py applies it against the extension's own CRD.)"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from dsv_helpers import children, container, find, spec, spec_dict
from sync_helpers import LIVE, READY, T1, UID, RecordingKube, observed, parent, refs

from duplex import reconcile
from duplex.apierrors import ApiError
from duplex.children.inference_pool import LLM_D_ROLE_LABEL, engine_pod_labels, inference_pool, pool_name
from duplex.children.kinds import (
    CHILD_KINDS,
    DEPLOYMENT,
    INFERENCE_POOL,
    LEADER_WORKER_SET,
    WATCHED_CHILD_KINDS,
    apply_rank,
)
from duplex.children.labels import KV_REVISION_LABEL, MANAGED_BY, ROLE_LABEL, SERVING_LABEL
from duplex.converge import covers
from duplex.render import InvalidSpec, parse_spec
from duplex.sync import sync

ON: dict[str, Any] = {"router": {"inferencePool": {"enabled": True}}}
PICKER: dict[str, Any] = {"router": {"inferencePool": {"enabled": True, "endpointPicker": {"name": "qwen-epp"}}}}
ENGINES = ("prefill", "decode")


def pools(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == "InferencePool"]


def pod_labels(deployment: dict[str, Any]) -> dict[str, str]:
    labels: dict[str, str] = deployment["spec"]["template"]["metadata"]["labels"]
    return labels


# --- off by default -----------------------------------------------------------------------------------------------


def test_off_by_default_no_pool_and_no_llm_d_label() -> None:
    assert spec().router.inference_pool.enabled is False
    objs = children()
    assert pools(objs) == []
    for deployment in (o for o in objs if o["kind"] == "Deployment"):
        assert not any(k.startswith("llm-d.ai/") for k in pod_labels(deployment))


def test_an_endpoint_picker_alone_enables_nothing() -> None:
    objs = children({"router": {"inferencePool": {"endpointPicker": {"name": "epp"}}}})
    assert pools(objs) == [] and objs == children()


# --- the pool -----------------------------------------------------------------------------------------------------


def test_the_pool_selects_exactly_the_router_pods_on_their_api_port() -> None:
    objs = children(ON, name="qwen", namespace="inference")
    (pool,) = pools(objs)
    assert (pool["apiVersion"], pool["kind"]) == ("inference.networking.k8s.io/v1", "InferencePool")
    assert pool["metadata"]["name"] == pool_name("qwen") == "qwen-router"
    assert pool["metadata"]["namespace"] == "inference"
    assert pool["metadata"]["labels"]["app.kubernetes.io/managed-by"] == MANAGED_BY  # the operator's watch filter
    selector = pool["spec"]["selector"]["matchLabels"]
    router = find(objs, "Deployment", "qwen-router")
    assert selector == router["spec"]["selector"]["matchLabels"] == {SERVING_LABEL: "qwen", ROLE_LABEL: "router"}
    assert selector.items() <= pod_labels(router).items()
    assert selector == find(objs, "Service", "qwen-router")["spec"]["selector"]
    for role in ENGINES:
        assert not selector.items() <= pod_labels(find(objs, "Deployment", f"qwen-{role}")).items()
    (http,) = [p for p in container(router)["ports"] if p["name"] == "http"]
    assert pool["spec"]["targetPorts"] == [{"number": http["containerPort"]}]
    assert "endpointPickerRef" not in pool["spec"]


def test_the_target_port_is_the_pods_whatever_the_service_port() -> None:
    (pool,) = pools(children({**ON, "router": {**ON["router"], "service": {"port": 80}}}))
    assert pool["spec"]["targetPorts"] == [{"number": 8000}]


def test_the_endpoint_picker_reference_and_its_defaults() -> None:
    (pool,) = pools(children(PICKER))
    assert pool["spec"]["endpointPickerRef"] == {
        "name": "qwen-epp",
        "port": {"number": 9002},
        "failureMode": "FailOpen",
    }
    picked = {"name": "epp", "port": 9102, "failureMode": "FailClose"}
    (pool,) = pools(children({"router": {"inferencePool": {"enabled": True, "endpointPicker": picked}}}))
    assert pool["spec"]["endpointPickerRef"] == {"name": "epp", "port": {"number": 9102}, "failureMode": "FailClose"}


def test_the_builder_alone() -> None:
    assert inference_pool(spec(), "demo", "ns1") == []
    assert [p["metadata"]["name"] for p in inference_pool(spec(ON), "demo", "ns1")] == ["demo-router"]


# --- llm-d's role label on engine pods ------------------------------------------------------------------------------


@pytest.mark.parametrize("role", ENGINES)
def test_engine_pods_carry_llm_ds_role_label_while_enabled(role: str) -> None:
    off, on = (find(children(p), "Deployment", f"demo-{role}") for p in (None, ON))
    assert pod_labels(on)[LLM_D_ROLE_LABEL] == role
    assert engine_pod_labels(spec(ON), role) == {LLM_D_ROLE_LABEL: role} and engine_pod_labels(spec(), role) == {}
    # Only the pod labels: the Deployment's selector is immutable, and its own labels are not llm-d's business.
    assert on["spec"]["selector"] == off["spec"]["selector"]
    assert LLM_D_ROLE_LABEL not in on["metadata"]["labels"]
    # The label alone changes: the same pod spec and the same KV revision, so the roll keeps the engines' KV.
    assert on["spec"]["template"]["spec"] == off["spec"]["template"]["spec"]
    assert pod_labels(on)[KV_REVISION_LABEL] == pod_labels(off)[KV_REVISION_LABEL]
    assert {k: v for k, v in pod_labels(on).items() if k != LLM_D_ROLE_LABEL} == pod_labels(off)


def test_router_pods_get_no_llm_d_label_and_do_not_roll() -> None:
    off, on = (find(children(p), "Deployment", "demo-router") for p in (None, ON))
    assert on == off


# --- the spec -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "picker,where",
    [
        ({}, "spec.router.inferencePool.endpointPicker.name"),
        ({"name": "Qwen-EPP"}, "spec.router.inferencePool.endpointPicker.name"),
        ({"name": "9epp"}, "spec.router.inferencePool.endpointPicker.name"),
        ({"name": "e" * 64}, "spec.router.inferencePool.endpointPicker.name"),
        ({"name": "epp", "port": 0}, "spec.router.inferencePool.endpointPicker.port"),
        ({"name": "epp", "port": 65536}, "spec.router.inferencePool.endpointPicker.port"),
        ({"name": "epp", "port": "9002"}, "spec.router.inferencePool.endpointPicker.port"),
        ({"name": "epp", "failureMode": "failopen"}, "spec.router.inferencePool.endpointPicker.failureMode"),
        ({"name": "epp", "kind": "Service"}, "spec.router.inferencePool.endpointPicker.kind"),
    ],
)
def test_bad_endpoint_pickers_are_refused_where_they_are(picker: dict[str, Any], where: str) -> None:
    with pytest.raises(InvalidSpec) as info:
        parse_spec(spec_dict({"router": {"inferencePool": {"enabled": True, "endpointPicker": picker}}}))
    assert len(info.value.errors) == 1 and info.value.errors[0].startswith(f"{where}: "), info.value.errors


def test_enabled_must_be_a_boolean_and_unknown_fields_are_refused() -> None:
    for bad in ({"enabled": "true"}, {"enabled": True, "selector": {"app": "x"}}):
        with pytest.raises(InvalidSpec):
            parse_spec(spec_dict({"router": {"inferencePool": bad}}))


# --- the kind -----------------------------------------------------------------------------------------------------


def test_the_kind_is_watched_optional_and_applied_after_the_workloads() -> None:
    assert INFERENCE_POOL in WATCHED_CHILD_KINDS and INFERENCE_POOL.optional
    assert [k for k in CHILD_KINDS if k.optional] == [LEADER_WORKER_SET, INFERENCE_POOL]
    assert CHILD_KINDS[-1] is INFERENCE_POOL and CHILD_KINDS.index(DEPLOYMENT) < CHILD_KINDS.index(INFERENCE_POOL)
    (pool,) = pools(children(ON))
    assert apply_rank(pool) == len(CHILD_KINDS) - 1


# --- the sync core: apply once, keep, prune -------------------------------------------------------------------------


def stored(pool: dict[str, Any]) -> dict[str, Any]:
    """The pool as the API server keeps it: with the extension's schema defaults and a status a Gateway wrote."""
    out = copy.deepcopy(pool)
    out["metadata"].update(uid="uid-pool", resourceVersion="9", generation=1)
    out["spec"].setdefault("appProtocol", "http")
    if "endpointPickerRef" in out["spec"]:
        out["spec"]["endpointPickerRef"].update(group="", kind="Service")
    out["status"] = {"parents": [{"parentRef": {"name": "inference-gateway"}, "conditions": []}]}
    return out


@pytest.mark.parametrize("patch", [ON, PICKER], ids=["no-picker", "picker"])
def test_enabling_applies_the_pool_and_rolls_only_the_engines(patch: dict[str, Any]) -> None:
    result = sync(parent(patch), LIVE, READY, at=T1)
    assert refs(result.apply) == ["Deployment/demo-prefill", "Deployment/demo-decode", "InferencePool/demo-router"]
    assert result.delete == [] and result.create == []
    (pool,) = pools(result.apply)
    assert pool["metadata"]["ownerReferences"][0]["uid"] == UID  # garbage-collected with its serving


@pytest.mark.parametrize("patch", [ON, PICKER], ids=["no-picker", "picker"])
def test_a_pool_as_stored_is_left_alone(patch: dict[str, Any]) -> None:
    live = [stored(o) if o["kind"] == "InferencePool" else o for o in observed(parent(patch))]
    assert len(pools(live)) == 1
    (pool,) = pools(live)
    (desired,) = pools(sync(parent(patch), [o for o in live if o is not pool], READY, at=T1).apply)
    assert covers(pool, desired)
    result = sync(parent(patch), live, None, at=T1)
    assert result.apply == [] and result.delete == [] and result.create == []


def test_a_changed_picker_is_applied_again() -> None:
    live = observed(parent(PICKER))
    moved = {"router": {"inferencePool": {"enabled": True, "endpointPicker": {"name": "qwen-epp", "port": 9003}}}}
    assert refs(sync(parent(moved), live, None, at=T1).apply) == ["InferencePool/demo-router"]
    dropped = {"router": {"inferencePool": {"enabled": True}}}
    assert refs(sync(parent(dropped), live, None, at=T1).apply) == ["InferencePool/demo-router"]


def test_disabling_deletes_the_pool_and_rolls_the_engines_back() -> None:
    result = sync(parent(), observed(parent(ON)), None, at=T1)
    assert refs(result.delete) == ["InferencePool/demo-router"]
    assert refs(result.apply) == ["Deployment/demo-prefill", "Deployment/demo-decode"]
    for deployment in result.apply:
        assert LLM_D_ROLE_LABEL not in pod_labels(deployment)


def test_a_pool_someone_else_owns_is_never_deleted() -> None:
    theirs = copy.deepcopy(pools(observed(parent(ON)))[0])
    theirs["metadata"]["ownerReferences"] = [{**theirs["metadata"]["ownerReferences"][0], "uid": "someone-else"}]
    result = sync(parent(), [*LIVE, theirs], READY, at=T1)
    assert result.delete == [] and result.apply == []


# --- the shell, on a cluster without the extension's CRD ------------------------------------------------------------


class NoPoolCRD(RecordingKube):
    """An API server that serves no InferencePools: a PATCH of one is a 404 with an empty Status."""

    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        if obj["kind"] == "InferencePool":
            self.calls.append(("apply-refused", *refs([obj])))
            raise ApiError(status=404, reason="NotFound", message="the server could not find the requested resource")
        return super().apply(obj)


def test_without_the_crd_every_other_child_is_applied_and_the_pass_says_why_not_the_pool() -> None:
    """The pool is applied last: a cluster without the extension still gets the workloads, the rest of the pass goes
    on (status), and a Warning Event names what is missing."""
    kube = NoPoolCRD()
    out = reconcile.reconcile_once(kube, parent(ON), [o for o in LIVE if o["kind"] != "Deployment"])  # type: ignore[arg-type]
    attempts = [ref for verb, ref in kube.calls if verb.startswith("apply")]
    assert attempts == [
        "Deployment/demo-prefill",
        "Deployment/demo-decode",
        "Deployment/demo-router",
        "InferencePool/demo-router",
    ]
    assert "InferencePool/demo-router" not in out.applied and out.status_written
    assert any(c[0] == "event" and "ExtensionMissing" in str(c) for c in kube.calls), kube.calls


def test_without_the_crd_the_applied_event_names_only_what_the_cluster_took() -> None:
    kube = NoPoolCRD()
    reconcile.reconcile_once(kube, parent(ON), [o for o in LIVE if o["kind"] != "Deployment"])  # type: ignore[arg-type]
    events = [c for c in kube.calls if c[0] == "event"]
    assert events[:2] == [("event", "Warning/ExtensionMissing"), ("event", "Normal/Applied")], events
    deployments = "Deployment/demo-prefill, Deployment/demo-decode, Deployment/demo-router"
    assert kube.messages[1] == f"converged children: {deployments}"
    # The next pass finds only the pool to apply: it says again what is missing, and that nothing was applied.
    kube = NoPoolCRD()
    reconcile.reconcile_once(kube, parent(ON), [o for o in observed(parent(ON)) if o["kind"] != "InferencePool"])  # type: ignore[arg-type]
    events = [c for c in kube.calls if c[0] == "event"]
    assert ("event", "Warning/ExtensionMissing") in events and ("event", "Normal/Applied") not in events, events

"""converge: a live object covers the desired one despite server defaults and quantity spellings, drift is detected,
and only stale children this serving owns are deleted."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from dsv_helpers import children, find

from duplex.converge import APPLIED_HASH, covers, key, owned_by, owner_reference, plan, with_owner

PARENT = {
    "apiVersion": "duplex.dev/v1alpha1",
    "kind": "DisaggregatedServing",
    "metadata": {"name": "demo", "namespace": "ns1", "uid": "uid-1"},
}
SEEDISH = {
    "network": {"efa": {"enabled": True}},
    "prefill": {"memory": "64Gi", "cpu": "0.5"},
    "decode": {"memory": "1024Mi", "cpu": "8"},
    "router": {"cpu": "0.5", "memory": "1024Mi"},
    "model": {"cache": {"pvc": {"claimName": "w"}}, "hfTokenSecret": {"name": "hf", "key": "t"}},
}


def serverize(obj: dict[str, Any]) -> dict[str, Any]:
    """What the API server returns for an applied object: defaults filled in, quantities canonicalised."""
    live = copy.deepcopy(with_owner(obj, PARENT))
    meta = live["metadata"]
    meta.update(
        uid="child-uid",
        resourceVersion="123",
        generation=1,
        creationTimestamp="2026-01-01T00:00:00Z",
        managedFields=[{"manager": "duplex-operator", "operation": "Apply"}],
    )
    kind = live["kind"]
    if kind == "Deployment":
        spec = live["spec"]
        spec.setdefault("progressDeadlineSeconds", 600)
        spec.setdefault("revisionHistoryLimit", 10)
        pod = spec["template"]["spec"]
        pod.update(
            dnsPolicy="ClusterFirst", restartPolicy="Always", schedulerName="default-scheduler", securityContext={}
        )
        pod.setdefault("terminationGracePeriodSeconds", 30)
        for vol in pod.get("volumes", []):
            if "configMap" in vol:
                vol["configMap"]["defaultMode"] = 420
        for ctr in pod["containers"]:
            ctr.update(terminationMessagePath="/dev/termination-log", terminationMessagePolicy="File")
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                if probe in ctr:
                    ctr[probe]["httpGet"]["scheme"] = "HTTP"
                    ctr[probe].setdefault("timeoutSeconds", 1)
                    ctr[probe].setdefault("successThreshold", 1)
            for section in ("requests", "limits"):
                amounts = ctr["resources"].get(section, {})
                for name, value in amounts.items():
                    amounts[name] = {"0.5": "500m", "1024Mi": "1Gi"}.get(value, value)
            for env in ctr.get("env", []):
                if "fieldRef" in env.get("valueFrom", {}):
                    env["valueFrom"]["fieldRef"]["apiVersion"] = "v1"
        live["status"] = {"observedGeneration": 1, "replicas": spec["replicas"], "readyReplicas": spec["replicas"]}
    elif kind == "Service":
        live["spec"].update(
            sessionAffinity="None", ipFamilies=["IPv4"], ipFamilyPolicy="SingleStack", internalTrafficPolicy="Cluster"
        )
        if live["spec"].get("clusterIP") != "None":
            live["spec"].update(clusterIP="10.0.0.7", clusterIPs=["10.0.0.7"])
        else:
            live["spec"]["clusterIPs"] = ["None"]
        live["status"] = {"loadBalancer": {}}
    return live


def desired() -> list[dict[str, Any]]:
    return [with_owner(o, PARENT) for o in children(SEEDISH)]


# --- covers -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "live,want",
    [
        ("0.5", "500m"),
        ("500m", "0.5"),
        ("1Gi", "1024Mi"),
        ("1024Mi", "1Gi"),
        ("1", "1000m"),
        ("2k", "2000"),
        ("1G", "1000M"),
        ("16", "16"),
    ],
)
def test_equal_quantities_cover(live: str, want: str) -> None:
    assert covers({"cpu": live}, {"cpu": want})


@pytest.mark.parametrize("live,want", [("1G", "1Gi"), ("500m", "0.6"), ("1Gi", "1025Mi"), ("8", "16")])
def test_different_quantities_do_not_cover(live: str, want: str) -> None:
    assert not covers({"cpu": live}, {"cpu": want})


def test_numbers_and_their_string_forms_cover() -> None:
    assert covers({"port": 8000}, {"port": "8000"}) and covers({"port": "8000"}, {"port": 8000})
    assert not covers({"port": 8001}, {"port": "8000"})


def test_non_quantity_strings_compare_exactly() -> None:
    assert covers({"image": "vllm:1"}, {"image": "vllm:1"})
    assert not covers({"image": "vllm:1"}, {"image": "vllm:2"})
    assert not covers({"name": "http"}, {"name": "HTTP"})


def test_server_added_fields_are_ignored() -> None:
    want = {"spec": {"replicas": 1, "template": {"spec": {"containers": [{"name": "a", "image": "x"}]}}}}
    live = {
        "spec": {
            "replicas": 1,
            "progressDeadlineSeconds": 600,
            "template": {
                "spec": {
                    "dnsPolicy": "ClusterFirst",
                    "containers": [{"name": "a", "image": "x", "terminationMessagePath": "/dev/termination-log"}],
                }
            },
        },
        "status": {"readyReplicas": 1},
    }
    assert covers(live, want)


def test_missing_or_changed_field_is_drift() -> None:
    want = {"spec": {"replicas": 2, "paused": None}}
    assert not covers({"spec": {"replicas": 1}}, want)
    assert not covers({"spec": {}}, want)
    assert not covers(None, want)
    assert not covers({"spec": {"replicas": "two"}}, {"spec": {"replicas": "2"}})


def test_empty_desired_values_are_covered_by_absence() -> None:
    assert covers({}, {"env": [], "labels": {}, "note": "", "x": None})
    assert covers(None, {})


def test_absent_zero_and_false_are_covered() -> None:
    # the API server omits zero values
    assert covers({}, {"maxUnavailable": 0, "publishNotReadyAddresses": False})
    assert not covers({"maxUnavailable": 1}, {"maxUnavailable": 0})
    assert not covers({"automount": True}, {"automount": False})


def test_lists_compare_element_by_element() -> None:
    want = {"env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]}
    assert covers({"env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]}, want)
    assert not covers({"env": [{"name": "A", "value": "1"}]}, want)  # removed element
    assert not covers({"env": [{"name": "A", "value": "1"}, {"name": "B", "value": "3"}]}, want)  # changed
    assert not covers({"env": [{"name": "B", "value": "2"}, {"name": "A", "value": "1"}]}, want)  # reordered
    assert not covers({"env": want["env"] + [{"name": "C", "value": "3"}]}, want)  # extra live element
    assert not covers({"env": {"name": "A"}}, want)  # not a list
    assert not covers({"env": []}, want)


def test_nested_type_mismatch_is_drift() -> None:
    assert not covers({"a": "x"}, {"a": {"b": 1}})
    assert not covers({"a": {"b": 1}}, {"a": ["b"]})


# --- plan against rendered children -----------------------------------------------------------------------------


def names(objs: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(o["kind"], o["metadata"]["name"]) for o in objs]


def test_nothing_live_applies_everything_in_order() -> None:
    want = desired()
    apply, delete = plan(want, [], "uid-1")
    assert apply == want and delete == []


def test_a_no_op_resync_applies_nothing() -> None:
    want = desired()
    live = [serverize(o) for o in children(SEEDISH)]
    assert plan(want, live, "uid-1") == ([], [])


def test_adopted_desired_vs_live_without_owner_reference_is_applied() -> None:
    live = [serverize(o) for o in children(SEEDISH)]
    for o in live:
        o["metadata"]["ownerReferences"] = []
    apply, _ = plan(desired(), live, "uid-1")
    assert len(apply) == len(live)


def _live() -> list[dict[str, Any]]:
    return [serverize(o) for o in children(SEEDISH)]


def test_changed_replicas_is_drift() -> None:
    live = _live()
    find(live, "Deployment", "demo-decode")["spec"]["replicas"] = 3
    apply, delete = plan(desired(), live, "uid-1")
    assert names(apply) == [("Deployment", "demo-decode")] and delete == []


def test_removed_env_var_is_drift() -> None:
    live = _live()
    ctr = find(live, "Deployment", "demo-prefill")["spec"]["template"]["spec"]["containers"][0]
    ctr["env"] = [e for e in ctr["env"] if e["name"] != "HF_TOKEN"]
    assert names(plan(desired(), live, "uid-1")[0]) == [("Deployment", "demo-prefill")]


def test_changed_list_element_is_drift() -> None:
    live = _live()
    ctr = find(live, "Deployment", "demo-prefill")["spec"]["template"]["spec"]["containers"][0]
    ctr["args"][ctr["args"].index("--tensor-parallel-size") + 1] = "2"
    svc = find(live, "Service", "demo-decode")
    svc["spec"]["ports"][1]["port"] = 5601
    assert names(plan(desired(), live, "uid-1")[0]) == [("Service", "demo-decode"), ("Deployment", "demo-prefill")]


def test_extra_live_list_element_is_drift() -> None:
    live = _live()
    pod = find(live, "Deployment", "demo-router")["spec"]["template"]["spec"]
    pod["containers"][0]["env"].append({"name": "INJECTED", "value": "1"})
    role = find(live, "Role", "demo-router")
    role["rules"].append({"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]})
    assert names(plan(desired(), live, "uid-1")[0]) == [("Role", "demo-router"), ("Deployment", "demo-router")]


def test_changed_configmap_data_and_hash_annotation_are_drift() -> None:
    live = _live()
    find(live, "ConfigMap", "demo-router")["data"]["router.json"] = "{}"
    template = find(live, "Deployment", "demo-decode")["spec"]["template"]
    template["metadata"]["annotations"]["duplex.dev/engine-config-hash"] = "0" * 16
    assert names(plan(desired(), live, "uid-1")[0]) == [("ConfigMap", "demo-router"), ("Deployment", "demo-decode")]


def test_spec_change_is_planned_for_exactly_the_affected_children() -> None:
    live = _live()
    changed = [with_owner(o, PARENT) for o in children({**SEEDISH, "kvTransfer": {"recomputeThreshold": 8}})]
    apply, _ = plan(changed, live, "uid-1")
    # engines roll with the new threshold; the ConfigMap shows it (kv-transfer-*.json); nothing else changes
    assert names(apply) == [("ConfigMap", "demo-router"), ("Deployment", "demo-prefill"), ("Deployment", "demo-decode")]


def test_only_owned_stale_children_are_deleted() -> None:
    live = _live()
    stale_owned = serverize(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "demo-old", "namespace": "ns1"},
            "spec": {"ports": []},
        }
    )
    stale_foreign = copy.deepcopy(stale_owned)
    stale_foreign["metadata"]["name"] = "someone-elses"
    stale_foreign["metadata"]["ownerReferences"] = [{**owner_reference(PARENT), "uid": "other-uid"}]
    unowned = copy.deepcopy(stale_owned)
    unowned["metadata"]["name"] = "hand-made"
    del unowned["metadata"]["ownerReferences"]
    apply, delete = plan(desired(), live + [stale_owned, stale_foreign, unowned], "uid-1")
    assert apply == []
    assert names(delete) == [("Service", "demo-old")]


def test_a_wanted_child_is_never_deleted_even_if_drifted() -> None:
    live = _live()
    find(live, "Deployment", "demo-prefill")["spec"]["replicas"] = 9
    apply, delete = plan(desired(), live, "uid-1")
    assert delete == [] and names(apply) == [("Deployment", "demo-prefill")]


def test_same_name_different_kind_is_a_different_child() -> None:
    live = _live()
    impostor = serverize(
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "demo-router", "namespace": "ns1"}}
    )
    apply, delete = plan(desired(), live + [impostor], "uid-1")
    assert apply == [] and names(delete) == [("Secret", "demo-router")]


# --- owner references -------------------------------------------------------------------------------------------


def test_owner_reference_and_with_owner() -> None:
    child = children()[0]
    before = copy.deepcopy(child)
    adopted = with_owner(child, PARENT)
    assert child == before  # with_owner is pure
    assert adopted["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "duplex.dev/v1alpha1",
            "kind": "DisaggregatedServing",
            "name": "demo",
            "uid": "uid-1",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    rest = {k: v for k, v in adopted["metadata"].items() if k not in ("ownerReferences", "annotations")}
    assert rest == {k: v for k, v in child["metadata"].items() if k != "annotations"}
    stamp = adopted["metadata"]["annotations"][APPLIED_HASH]
    assert with_owner(child, PARENT)["metadata"]["annotations"][APPLIED_HASH] == stamp  # deterministic
    edited = copy.deepcopy(child)
    edited["metadata"]["labels"] = {**edited["metadata"].get("labels", {}), "extra": "x"}
    assert with_owner(edited, PARENT)["metadata"]["annotations"][APPLIED_HASH] != stamp
    assert owned_by(adopted, "uid-1") and not owned_by(adopted, "uid-2") and not owned_by(child, "uid-1")
    assert not owned_by({"metadata": {"ownerReferences": None}}, "uid-1") and not owned_by({}, "uid-1")


def test_key() -> None:
    d = children()[-1]
    assert key(d) == ("apps/v1", "Deployment", "demo-router")

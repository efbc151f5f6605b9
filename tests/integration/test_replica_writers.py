"""One writer of each role's replicas, on the real API server: a role in scaling mode External belongs to a real
HorizontalPodAutoscaler (run by the kube-controller-manager) while the operator rolls its template, and to
`kubectl scale` (another field manager); a Fixed role is set back with a Warning Event; switching modes scales
nothing; a role in mode Automatic is sized by the operator's planner from a router's load report. Ownership is read
from the Deployment's managedFields."""

from __future__ import annotations

import copy
import datetime
import json
from typing import Any

import pytest
import yaml
from conftest import KubectlError
from operator_harness import ROOT

from duplex.api.meta import FIELD_MANAGER
from duplex.replicas import HANDOVER

pytestmark = pytest.mark.cluster

SEED = yaml.safe_load((ROOT / "examples" / "seed.yaml").read_text())
DECODE = "qwen3-32b-decode"


def serving(namespace: str, **decode: Any) -> dict[str, Any]:
    doc = copy.deepcopy(SEED)
    doc["metadata"]["namespace"] = namespace
    doc["spec"]["decode"].update(decode)
    return doc


def deployment(kubectl: Any, namespace: str) -> dict[str, Any]:
    """The decode Deployment with its managedFields; {} until the operator has made it."""
    try:
        return dict(kubectl.json("-n", namespace, "get", "deployment", DECODE, "--show-managed-fields"))
    except KubectlError as err:
        if "NotFound" not in err.stderr:
            raise
        return {"metadata": {"managedFields": []}, "spec": {}}


def replica_owners(deploy: dict[str, Any]) -> set[str]:
    """The field managers that own .spec.replicas."""
    return {
        e["manager"]
        for e in deploy["metadata"]["managedFields"]
        if "f:replicas" in ((e.get("fieldsV1") or {}).get("f:spec") or {})
    }


def settled(operator: Any, wait_for: Any, passes: int = 3) -> None:
    """Until the operator has made `passes` more reconcile passes (a resync every 2 s): what it would write, it has."""
    start = operator.metric("duplex_reconciles_total", result="ok")
    wait_for(lambda: operator.metric("duplex_reconciles_total", result="ok") >= start + passes, timeout=60)


def hpa(namespace: str, minimum: int) -> dict[str, Any]:
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": DECODE, "namespace": namespace},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": DECODE},
            "minReplicas": minimum,
            "maxReplicas": minimum + 1,
            "metrics": [
                {
                    "type": "Resource",
                    "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 80}},
                }
            ],
        },
    }


def status_replicas(kubectl: Any, namespace: str) -> int | None:
    status = kubectl.json("-n", namespace, "get", "dsv", "qwen3-32b").get("status") or {}
    return (status.get("decode") or {}).get("replicas")


def test_an_hpa_owns_an_external_role_while_the_operator_rolls_it(operator, kubectl, namespace, wait_for):
    kubectl.apply(serving(namespace, scaling={"mode": "External"}))
    wait_for(lambda: deployment(kubectl, namespace)["spec"].get("replicas") == 1, timeout=60, what="decode created")
    settled(operator, wait_for)
    owners = replica_owners(deployment(kubectl, namespace))
    assert FIELD_MANAGER not in owners and HANDOVER in owners

    # A real HPA: below its minimum it scales without metrics (there is no metrics server here).
    kubectl.apply(hpa(namespace, minimum=2))
    wait_for(lambda: deployment(kubectl, namespace)["spec"]["replicas"] == 2, timeout=90, what="the HPA's 2 replicas")
    wait_for(lambda: status_replicas(kubectl, namespace) == 2, timeout=60, what="status.decode.replicas 2")

    # An engine change rolls the template; the HPA's size stands.
    generation = deployment(kubectl, namespace)["metadata"]["generation"]
    kubectl.apply(serving(namespace, scaling={"mode": "External"}, maxNumSeqs=16))
    wait_for(lambda: deployment(kubectl, namespace)["metadata"]["generation"] > generation, timeout=60, what="a roll")
    settled(operator, wait_for)
    deploy = deployment(kubectl, namespace)
    assert "--max-num-seqs" in deploy["spec"]["template"]["spec"]["containers"][0]["args"]
    assert deploy["spec"]["replicas"] == 2
    assert FIELD_MANAGER not in replica_owners(deploy)


def test_switching_modes_scales_nothing_and_a_fixed_role_is_set_back(operator, kubectl, namespace, wait_for):
    kubectl.apply(serving(namespace, replicas=2))
    wait_for(lambda: status_replicas(kubectl, namespace) == 2, timeout=60, what="2 decode replicas")
    assert FIELD_MANAGER in replica_owners(deployment(kubectl, namespace))

    # Fixed -> External at the same size: the field changes hands, not value; another writer's size then stands.
    kubectl.apply(serving(namespace, replicas=2, scaling={"mode": "External"}))
    wait_for(lambda: FIELD_MANAGER not in replica_owners(deployment(kubectl, namespace)), timeout=60, what="handover")
    assert deployment(kubectl, namespace)["spec"]["replicas"] == 2
    kubectl("-n", namespace, "scale", "deployment", DECODE, "--replicas=3")
    settled(operator, wait_for)
    assert deployment(kubectl, namespace)["spec"]["replicas"] == 3
    assert "kubectl" in " ".join(replica_owners(deployment(kubectl, namespace)))

    # External -> Fixed at what the other writer left: nothing scales, the operator owns the field again.
    kubectl.apply(serving(namespace, replicas=3))
    wait_for(lambda: FIELD_MANAGER in replica_owners(deployment(kubectl, namespace)), timeout=60, what="taken back")
    assert deployment(kubectl, namespace)["spec"]["replicas"] == 3

    # Fixed: a size someone else sets goes back, and the serving says who won.
    kubectl("-n", namespace, "scale", "deployment", DECODE, "--replicas=1")
    wait_for(lambda: deployment(kubectl, namespace)["spec"]["replicas"] == 3, timeout=60, what="set back to 3")
    events = kubectl.json("-n", namespace, "get", "events", "--field-selector", "reason=ReplicasOverwritten")["items"]
    assert events and f"{DECODE} was scaled to 1" in events[0]["message"]


def test_the_planner_scales_an_automatic_role_on_the_routers_load(operator, kubectl, namespace, wait_for):
    automatic = {"mode": "Automatic", "minReplicas": 1, "maxReplicas": 3}
    kubectl.apply(serving(namespace, scaling=automatic, maxNumSeqs=8))
    wait_for(lambda: deployment(kubectl, namespace)["spec"].get("replicas") == 1, timeout=60, what="decode created")
    # What a router's fabric report carries (router/load.py): 1.5 decode engines' worth of legs over the last minute.
    at = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    load = {"seconds": 60, "decode": {"demand": 1.5, "saturation": 1.5, "peak": 2.0}, "turns": 40, "ttft_p90": 0.8}
    report = {"healthy": True, "measured": False, "message": "", "at": at, "load": load}
    patch = {"data": {"qwen3-32b-router-x": json.dumps(report)}}
    kubectl("-n", namespace, "patch", "configmap", "qwen3-32b-fabric", "--type=merge", "-p", json.dumps(patch))
    # 1.5 / 0.75 = 2, and 2 it stays while the same report is read again with 2 pods (maxReplicas is 3)
    wait_for(lambda: deployment(kubectl, namespace)["spec"]["replicas"] == 2, timeout=60, what="the planner's 2")
    settled(operator, wait_for)
    assert deployment(kubectl, namespace)["spec"]["replicas"] == 2
    assert FIELD_MANAGER in replica_owners(deployment(kubectl, namespace))
    plan = kubectl.json("-n", namespace, "get", "dsv", "qwen3-32b")["status"]["autoscaling"]
    # after the scale-up the same measurement holds the size; the Event says what happened
    assert plan["decode"]["reason"] == "Hold" and plan["decode"]["demand"] == 1.5 and plan["routers"] == 1
    events = kubectl.json("-n", namespace, "get", "events", "--field-selector", "reason=Autoscaled")["items"]
    assert events and events[0]["message"].startswith("decode 1 -> 2")

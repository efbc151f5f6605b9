"""The Argo CD health check against the live operator, and the captured status fixtures it is unit-tested on.

Each case drives a real DisaggregatedServing into one state (created, Healthy, Progressing twice, Degraded
twice, Suspended), runs the Lua check on the live object, and compares the object's status shape (keys, types, condition
statuses and reasons) with its fixture in tests/fixtures/dsv-status/: the test fails when the operator's status
drifts from what the fixtures, and so the unit-tested check, assume. DUPLEX_UPDATE_FIXTURES=1 rewrites them."""

from __future__ import annotations

import copy
import json
import os
import re
import sys
from typing import Any

import pytest
import yaml
from operator_harness import ROOT

sys.path.insert(0, str(ROOT / "tests" / "observability"))

from argocd_health import EXPECTED, FIXTURES, health, shape
from chart_release import restore_generated_crd

pytestmark = pytest.mark.cluster

SEED = yaml.safe_load((ROOT / "examples" / "seed.yaml").read_text())
UPDATE = os.environ.get("DUPLEX_UPDATE_FIXTURES") == "1"
FIXTURE_NAMESPACE = "ml"


def seed(namespace: str) -> dict[str, Any]:
    doc = copy.deepcopy(SEED)
    doc["metadata"]["namespace"] = namespace
    return doc


def get(kubectl: Any, namespace: str) -> dict[str, Any]:
    return kubectl.json("-n", namespace, "get", "dsv", "qwen3-32b")


def conditions(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in (obj.get("status") or {}).get("conditions") or []}


def settled(obj: dict[str, Any]) -> bool:
    return (obj.get("status") or {}).get("observedGeneration") == obj["metadata"]["generation"]


def patch(kubectl: Any, namespace: str, spec: dict[str, Any]) -> None:
    kubectl("-n", namespace, "patch", "dsv", "qwen3-32b", "--type=merge", "-p", json.dumps({"spec": spec}))


def fixture_form(obj: dict[str, Any], namespace: str) -> dict[str, Any]:
    """The object as Argo CD gets it, minus what differs per run (uid, resourceVersion, managedFields), with the
    test's namespace replaced by a fixed one."""
    meta = obj["metadata"]
    kept = {"apiVersion": obj["apiVersion"], "kind": obj["kind"]}
    kept["metadata"] = {k: meta[k] for k in ("name", "namespace", "generation", "creationTimestamp") if k in meta}
    kept["spec"] = obj["spec"]
    if "status" in obj:
        kept["status"] = obj["status"]
    return json.loads(re.sub(re.escape(namespace), FIXTURE_NAMESPACE, json.dumps(kept)))


def check_against_fixture(name: str, obj: dict[str, Any], namespace: str) -> None:
    live = fixture_form(obj, namespace)
    status, message = health(live)
    assert status == EXPECTED[name], (name, status, message, live.get("status"))
    path = FIXTURES / f"{name}.json"
    if UPDATE or not path.exists():
        FIXTURES.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(live, indent=2, sort_keys=True) + "\n")
    captured = json.loads(path.read_text())
    assert shape(live) == shape(captured), (
        f"the operator's status for '{name}' no longer has the shape of {path}; check the Argo CD health check "
        "(charts/duplex/files/argocd-health.lua) against it, then rerun with DUPLEX_UPDATE_FIXTURES=1"
    )


def test_just_created(operator, kubectl, namespace):
    # The API server's answer to the create: the object before any controller has seen it.
    created = json.loads(kubectl("create", "-o", "json", "-f", "-", input=yaml.safe_dump(seed(namespace))))
    assert "status" not in created
    check_against_fixture("created", created, namespace)


def test_healthy_then_progressing(operator, kubectl, namespace, wait_for):
    kubectl.apply(seed(namespace))
    wait_for(lambda: "Ready" in conditions(o := get(kubectl, namespace)) and settled(o)
             and conditions(o)["Ready"]["status"] == "True", timeout=180, what="Ready")  # fmt: skip
    check_against_fixture("healthy", get(kubectl, namespace), namespace)
    # An engine change whose surge pod can never schedule: the roll starts and cannot finish.
    patch(kubectl, namespace, {"prefill": {"nodeSelector": {"node.kubernetes.io/instance-type": "p6-b300.48xlarge"}}})
    wait_for(lambda: settled(o := get(kubectl, namespace)) and conditions(o)["Progressing"]["status"] == "True",
             timeout=120, what="Progressing=True")  # fmt: skip
    check_against_fixture("progressing", get(kubectl, namespace), namespace)


def _decode_unschedulable(kubectl: Any, namespace: str, deadline: int | None = None) -> None:
    doc = seed(namespace)
    doc["spec"]["decode"]["nodeSelector"] = {"node.kubernetes.io/instance-type": "p6-b300.48xlarge"}
    if deadline is not None:
        doc["spec"]["decode"]["rollout"] = {"progressDeadlineSeconds": deadline}
    kubectl.apply(doc)


def _decode_reason(kubectl: Any, namespace: str, reason: str) -> bool:
    obj = get(kubectl, namespace)
    c = conditions(obj)
    return (
        settled(obj)
        and c.get("DecodeReady", {}).get("reason") == reason
        and c.get("PrefillReady", {}).get("status") == "True"
    )


def test_role_starting(operator, kubectl, namespace, wait_for):
    """Decode pods that cannot start yet, within the Deployment's progress deadline (600 s by default): Progressing,
    as Argo CD shows a Deployment, so a first start that loads a model for minutes is never Degraded."""
    _decode_unschedulable(kubectl, namespace)
    wait_for(lambda: _decode_reason(kubectl, namespace, "Starting"), timeout=180, what="prefill ready, decode starting")
    check_against_fixture("starting", get(kubectl, namespace), namespace)


def test_role_not_ready(operator, kubectl, namespace, wait_for):
    """The same past a 10 s progress deadline: the Deployment controller marks ProgressDeadlineExceeded, Degraded."""
    _decode_unschedulable(kubectl, namespace, deadline=10)
    wait_for(
        lambda: _decode_reason(kubectl, namespace, "ReplicasNotReady"), timeout=180, what="decode past its deadline"
    )
    check_against_fixture("degraded-role-not-ready", get(kubectl, namespace), namespace)


def test_suspended(operator, kubectl, namespace, wait_for):
    doc = seed(namespace)
    doc["spec"]["prefill"]["replicas"] = 0
    kubectl.apply(doc)
    wait_for(lambda: settled(o := get(kubectl, namespace)) and conditions(o).get("PrefillReady", {}).get("reason")
             == "ScaledToZero" and conditions(o).get("DecodeReady", {}).get("status") == "True",
             timeout=180, what="prefill scaled to zero, decode ready")  # fmt: skip
    check_against_fixture("suspended", get(kubectl, namespace), namespace)


def test_invalid_spec(operator, kubectl, namespace, wait_for):
    """A spec the operator refuses. Admission rejects it today, so it is stored the way it would be under an
    older, laxer CRD: with the spec-level CEL rules taken out for the moment of the create."""
    crd = kubectl.json("get", "crd", "disaggregatedservings.duplex.dev")
    lax = {k: crd[k] for k in ("apiVersion", "kind", "spec")} | {"metadata": {"name": crd["metadata"]["name"]}}
    lax["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"].pop("x-kubernetes-validations")
    doc = seed(namespace)
    doc["spec"]["router"]["conversation"]["ttl"] = doc["spec"]["kvTransfer"]["decodeBlocksTTL"]
    try:
        kubectl(
            "apply",
            "--server-side",
            "--force-conflicts",
            "--field-manager=duplex-tests",
            "-f",
            "-",
            input=json.dumps(lax),
        )
        wait_for(lambda: _admits(kubectl, doc), timeout=30, what="the laxer CRD in effect")
        kubectl.apply(doc)
    finally:
        restore_generated_crd(kubectl)
    wait_for(lambda: settled(o := get(kubectl, namespace)) and conditions(o).get("ConfigValid", {}).get("status")
             == "False", timeout=120, what="ConfigValid=False")  # fmt: skip
    obj = get(kubectl, namespace)
    assert "router.conversation.ttl must be strictly below" in conditions(obj)["ConfigValid"]["message"]
    check_against_fixture("degraded-invalid-spec", obj, namespace)


def _admits(kubectl: Any, doc: dict[str, Any]) -> bool:
    try:
        kubectl("apply", "--dry-run=server", "-f", "-", input=yaml.safe_dump(doc))
        return True
    except AssertionError:
        return False

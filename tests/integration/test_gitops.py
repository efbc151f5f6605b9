"""DisaggregatedServings under GitOps: applied server-side by another field manager (Argo CD's and Flux's), the
operator reconciles without ever writing under .spec, a server-side dry run of the same manifest changes nothing
(no perpetual diff), and the status follows what GitOps tools wait on: observedGeneration and a Ready condition
that `kubectl wait --for=condition=Ready` understands."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
import yaml
from operator_harness import ROOT

pytestmark = pytest.mark.cluster

SEED = yaml.safe_load((ROOT / "examples" / "seed.yaml").read_text())
# The field managers Argo CD (ServerSideApply=true) and Flux's kustomize-controller apply with.
MANAGERS = ("argocd-controller", "kustomize-controller")


def manifest(namespace: str) -> str:
    doc = copy.deepcopy(SEED)
    doc["metadata"]["namespace"] = namespace
    return yaml.safe_dump(doc)


def apply(kubectl: Any, manager: str, text: str, *extra: str) -> dict[str, Any]:
    out = kubectl("apply", "--server-side", f"--field-manager={manager}", "-o", "json", *extra, "-f", "-", input=text)
    return json.loads(out)


def fields_under(entry: dict[str, Any], top: str) -> bool:
    return f"f:{top}" in (entry.get("fieldsV1") or {})


@pytest.mark.parametrize("manager", MANAGERS)
def test_gitops_apply_reconcile_and_no_drift(operator, kubectl, namespace, manager, wait_for):
    text = manifest(namespace)
    apply(kubectl, manager, text)
    # What Argo CD's health wait and Flux's kstatus wait on.
    kubectl("-n", namespace, "wait", "--for=condition=Ready", "dsv/qwen3-32b", "--timeout=180s", timeout=240)
    kubectl("-n", namespace, "wait", "--for=jsonpath={.status.observedGeneration}=1", "dsv/qwen3-32b", "--timeout=30s")

    def settled() -> dict[str, Any] | None:
        # Status writes stop once the last pod transition is recorded; take the object after two quiet resyncs.
        first = kubectl.json("-n", namespace, "get", "dsv", "qwen3-32b")
        wait_for(lambda: operator.metric("duplex_reconciles_total", result="ok") >= passes + 2, timeout=30)
        second = kubectl.json("-n", namespace, "get", "dsv", "qwen3-32b", "--show-managed-fields")
        return second if first["metadata"]["resourceVersion"] == second["metadata"]["resourceVersion"] else None

    passes = operator.metric("duplex_reconciles_total", result="ok")
    live = wait_for(settled, timeout=90, interval=0.1, what="the status to settle")

    # The operator never owns a field under .spec; the GitOps manager owns all of it.
    entries = live["metadata"]["managedFields"]
    assert [e for e in entries if fields_under(e, "spec")] == [e for e in entries if e["manager"] == manager]
    assert any(e["manager"] == manager and fields_under(e, "spec") for e in entries)
    status_owners = {e["manager"] for e in entries if fields_under(e, "status")}
    assert status_owners and manager not in status_owners

    # Re-applying the manifest is a no-op: dry run and real apply leave the object, and its version, unchanged.
    dry = apply(kubectl, manager, text, "--dry-run=server")
    assert dry["metadata"]["resourceVersion"] == live["metadata"]["resourceVersion"]
    assert dry["spec"] == live["spec"]
    diff = kubectl("diff", "--server-side", f"--field-manager={manager}", "-f", "-", input=text)
    assert diff == ""  # kubectl diff exits 1 (raising) when there is a difference
    again = apply(kubectl, manager, text)
    assert again["metadata"]["resourceVersion"] == live["metadata"]["resourceVersion"]
    assert again["metadata"]["generation"] == 1


def test_wait_for_ready_times_out_while_not_ready(operator, kubectl, namespace):
    """The Ready condition is honest: a serving whose decode cannot schedule is never Ready for kubectl wait."""
    doc = yaml.safe_load(manifest(namespace))
    doc["spec"]["decode"]["nodeSelector"] = {"node.kubernetes.io/instance-type": "p6-b300.48xlarge"}
    apply(kubectl, MANAGERS[0], yaml.safe_dump(doc))
    kubectl(
        "-n",
        namespace,
        "wait",
        "--for=jsonpath={.status.observedGeneration}=1",
        "dsv/qwen3-32b",
        "--timeout=120s",
        timeout=180,
    )
    with pytest.raises(AssertionError):  # kubectl wait exits 1 on its timeout
        kubectl("-n", namespace, "wait", "--for=condition=Ready", "dsv/qwen3-32b", "--timeout=10s")
    ready = kubectl.json("-n", namespace, "get", "dsv", "qwen3-32b")["status"]["conditions"][0]
    assert ready["type"] == "Ready" and ready["status"] == "False" and ready["observedGeneration"] == 1

"""Scale-in removes the cheapest decode pod: before a pass lowers decode's replicas, every decode pod gets the
routers' count of the conversations bound to it as its pod-deletion-cost, so that the ReplicaSet deletes the pods
holding the fewest first. Written only on a scale-in, never per request."""

from __future__ import annotations

import copy
import json
from typing import Any

from sync_helpers import LIVE, READY, T1, RecordingKube, parent, refs

from duplex.reconcile import reconcile_once
from duplex.scale_in import DELETION_COST, bindings, deletion_costs
from duplex.sync import sync


def pod(name: str, ip: str, role: str = "decode", cost: str | None = None, deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": "ns1",
        "labels": {"duplex.dev/serving": "demo", "duplex.dev/role": role},
    }
    if cost is not None:
        meta["annotations"] = {DELETION_COST: cost}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "status": {"podIP": ip}}


def report(counts: dict[str, int]) -> tuple[str, dict[str, Any]]:
    return ("router-0", {"at": "2026-01-01T00:04:00Z", "bindings": counts})


PODS = [pod("d-a", "10.0.0.1"), pod("d-b", "10.0.0.2"), pod("d-c", "10.0.0.3"), pod("p-a", "10.0.0.9", "prefill")]


def costs(patches: list[dict[str, Any]]) -> dict[str, str]:
    return {p["metadata"]["name"]: p["metadata"]["annotations"][DELETION_COST] for p in patches}


def test_on_a_scale_in_each_decode_pod_costs_its_bindings() -> None:
    reports = [report({"10.0.0.1:8000": 5, "10.0.0.2:8000": 0, "10.0.0.3:8000": 2})]
    assert costs(deletion_costs("demo", True, PODS, reports)) == {"d-a": "5", "d-b": "0", "d-c": "2"}


def test_nothing_is_written_without_a_scale_in_or_when_costs_stand() -> None:
    reports = [report({"10.0.0.1:8000": 5})]
    assert deletion_costs("demo", False, PODS, reports) == []
    settled = [
        pod("d-a", "10.0.0.1", cost="5"),
        pod("d-b", "10.0.0.2", cost="0"),
        pod("d-z", "10.0.0.7", deleting=True),
    ]
    assert deletion_costs("demo", True, settled, reports) == []


def test_routers_sharing_redis_count_the_same_bindings_once() -> None:
    both = [report({"10.0.0.1:8000": 4}), ("router-1", {"bindings": {"10.0.0.1:8000": 3, "x": True}})]
    assert bindings(both) == {"10.0.0.1:8000": 4}


def live_with(decode_replicas: int) -> list[dict[str, Any]]:
    live = copy.deepcopy(LIVE)
    for obj in live:
        if obj["kind"] == "Deployment" and obj["metadata"]["name"] == "demo-decode":
            obj["spec"]["replicas"] = decode_replicas
        if obj["kind"] == "ConfigMap" and obj["metadata"]["name"] == "demo-fabric":
            obj["data"] = {"router-0": json.dumps({"at": "2026-01-01T00:04:00Z", "bindings": {"10.0.0.1:8000": 7}})}
    return live


def test_a_pass_that_scales_decode_out_or_keeps_it_writes_no_cost() -> None:
    pods = [pod("d-a", "10.0.0.1"), pod("d-b", "10.0.0.2")]
    assert sync(parent({"decode": {"replicas": 2}}), [*live_with(2), *pods], READY, at=T1).annotate == []
    assert sync(parent({"decode": {"replicas": 3}}), [*live_with(2), *pods], READY, at=T1).annotate == []


def test_with_an_external_writer_of_replicas_the_costs_are_kept_current() -> None:
    external = parent({"decode": {"replicas": 1, "scaling": {"mode": "External"}}})
    pods = [pod("d-a", "10.0.0.1"), pod("d-b", "10.0.0.2")]
    assert costs(sync(external, [*live_with(2), *pods], READY, at=T1).annotate) == {"d-a": "7", "d-b": "0"}


def test_the_pass_that_scales_decode_in_annotates_the_pods_before_it_applies_the_deployment() -> None:
    scaled_in = parent({"decode": {"replicas": 1}})
    live = live_with(2)
    pods = [pod("d-a", "10.0.0.1"), pod("d-b", "10.0.0.2")]
    result = sync(scaled_in, [*live, *pods], READY, at=T1)
    assert costs(result.annotate) == {"d-a": "7", "d-b": "0"}
    assert "Deployment/demo-decode" in refs(result.apply)

    kube = RecordingKube(exists=True)
    reconcile_once(kube, {**scaled_in, "status": READY}, [*live, *pods])  # type: ignore[arg-type]
    calls = [c for c in kube.calls if c[0] in ("annotate", "apply")]
    assert calls.index(("annotate", "Pod/d-a")) < calls.index(("apply", "Deployment/demo-decode"))

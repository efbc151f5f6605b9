"""A new KV revision's prefill and decode pods become Ready together: the operator opens a role's readiness gates only
as far as the other role has come, so the old revision loses both roles at the same pace."""

from __future__ import annotations

from typing import Any

from duplex.lockstep import allowed, gate_patches

REV = "abcd0123"


def pod(name: str, role: str, ready: bool = True, gated: bool = False, rev: str = REV, **meta: Any) -> dict[str, Any]:
    conditions = [{"type": "ContainersReady", "status": "True" if ready else "False"}]
    if gated:
        conditions.append({"type": "duplex.dev/kv-paired", "status": "True"})
    labels = {"duplex.dev/serving": "demo", "duplex.dev/role": role, "duplex.dev/kv-revision": rev}
    return {
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "ns1", "labels": labels, **meta},
        "status": {"conditions": conditions},
    }


def opened(pods: list[dict[str, Any]], prefill: int = 2, decode: int = 2) -> list[str]:
    patches = gate_patches("demo", REV, {"prefill": prefill, "decode": decode}, pods, "t")
    for p in patches:
        (condition,) = p["status"]["conditions"]
        assert condition["type"] == "duplex.dev/kv-paired" and condition["status"] == "True"
    return [p["metadata"]["name"] for p in patches]


def test_a_role_waits_until_the_other_has_a_ready_pod() -> None:
    assert opened([pod("p1", "prefill"), pod("d1", "decode", ready=False)]) == []
    assert opened([pod("p1", "prefill"), pod("d1", "decode")]) == ["p1", "d1"]


def test_roles_progress_at_the_pace_of_the_other() -> None:
    # 4 prefill of 4 ready, 1 decode of 4: prefill may have only 1 Ready
    pods = [pod(f"p{i}", "prefill") for i in range(4)] + [pod("d0", "decode")]
    pods += [pod(f"d{i}", "decode", ready=False) for i in (1, 2, 3)]
    assert opened(pods, 4, 4) == ["p0", "d0"]
    # 2 of 4 decode ready: 2 prefill
    pods[5] = pod("d1", "decode")
    assert opened(pods, 4, 4) == ["p0", "p1", "d0", "d1"]


def test_gates_already_open_count_and_are_never_closed() -> None:
    pods = [pod("p0", "prefill", gated=True), pod("p1", "prefill"), pod("d0", "decode", gated=True)]
    assert opened(pods) == []  # 1 decode of 2 ready: 1 prefill, and p0 is it
    pods.append(pod("d1", "decode"))
    assert opened(pods) == ["p1", "d1"]


def test_only_the_wanted_revision_of_this_serving_and_pods_not_leaving() -> None:
    pods = [
        pod("p0", "prefill", rev="old00000"),
        pod("d0", "decode"),
        pod("p1", "prefill", deletionTimestamp="t"),
        {
            **pod("p2", "prefill"),
            "metadata": {**pod("p2", "prefill")["metadata"], "labels": {"duplex.dev/serving": "x"}},
        },
    ]
    assert opened(pods) == []


def test_a_compatible_rolls_surge_pod_opens_while_the_other_role_is_whole() -> None:
    # one replica each: the old decode pod (same revision, gate open) and the roll's surge pod
    pods = [pod("p0", "prefill", gated=True), pod("d-old", "decode", gated=True), pod("d-new", "decode")]
    assert opened(pods, 1, 1) == ["d-new"]


def test_ratio_and_scaled_to_zero() -> None:
    assert allowed(2, 1, 8) == 1  # 1 of 8 decode: still one prefill
    assert allowed(8, 1, 2) == 4
    assert allowed(3, 0, 2) == 0
    assert allowed(3, 0, 0) == 3  # no other role to wait for


def test_pods_from_before_revisions_have_no_gate() -> None:
    assert gate_patches("demo", "", {"prefill": 1, "decode": 1}, [pod("p", "prefill", rev="")], "t") == []


def test_a_pass_opens_the_gates_of_the_revision_it_renders() -> None:
    from sync_helpers import T1, RecordingKube, observed, parent

    from duplex import reconcile, revision
    from duplex.sync import sync

    live = observed(parent())
    (prefill,) = [o for o in live if o["kind"] == "Deployment" and o["metadata"]["name"] == "demo-prefill"]
    rev = revision.of_template(prefill["spec"]["template"])
    assert rev
    pods = [{**pod(f"{r}-0", r, rev=rev), "apiVersion": "v1"} for r in ("prefill", "decode")]
    for p in pods:
        p["metadata"]["labels"]["duplex.dev/serving"] = "demo"
    result = sync(parent(), [*live, *pods], None, at=T1)
    assert sorted(p["metadata"]["name"] for p in result.gates) == ["decode-0", "prefill-0"]
    kube = RecordingKube()
    reconcile.reconcile_once(kube, parent(), [*live, *pods])  # type: ignore[arg-type]
    assert {c for c in kube.calls if c[0] == "pod_status"} == {
        ("pod_status", "Pod/decode-0"),
        ("pod_status", "Pod/prefill-0"),
    }

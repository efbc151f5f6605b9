"""status.compute: per-role counts and conditions from the live Deployments; Ready only when prefill, decode and
router are all ready on the current template; transition times kept while a condition holds; status for a refused
spec; differs() for write avoidance."""

from __future__ import annotations

import json
from typing import Any

import pytest
from dsv_helpers import serving

from duplex import status
from duplex.api.status import CONDITION_TYPES, DisaggregatedServingStatus
from duplex.children.engine import engine_config_hash
from duplex.children.kv_config import effective

WORKLOADS = ("prefill", "decode", "router")
T0, T1, T2 = "2026-01-01T00:00:00Z", "2026-01-01T00:01:00Z", "2026-01-01T00:02:00Z"


@pytest.fixture(autouse=True)
def clock(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    times = [T0]
    monkeypatch.setattr(status, "now", lambda: times[0])
    return times


def dep(
    replicas: int,
    ready: int | None = None,
    updated: int | None = None,
    generation: int = 1,
    observed: int | None = None,
    total: int | None = None,
) -> dict[str, Any]:
    ready = replicas if ready is None else ready
    updated = replicas if updated is None else updated
    st = {
        "observedGeneration": generation if observed is None else observed,
        "replicas": replicas if total is None else total,
        "readyReplicas": ready,
        "updatedReplicas": updated,
        "availableReplicas": ready,
    }
    return {"metadata": {"generation": generation}, "spec": {"replicas": replicas}, "status": st}


def all_ready(p: int = 1, d: int = 1, r: int = 1) -> dict[str, Any]:
    return {"prefill": dep(p), "decode": dep(d), "router": dep(r)}


def conds(st: dict[str, Any]) -> dict[str, dict[str, Any]]:
    types = [c["type"] for c in st["conditions"]]
    assert len(types) == len(set(types))
    return {c["type"]: c for c in st["conditions"]}


SERVING = serving(name="qwen", namespace="inference")


def compute(deployments: dict[str, Any], previous: dict[str, Any] | None = None, s: Any = SERVING) -> dict[str, Any]:
    """The status as written: the typed model's patch body, from a previous status as read back from the API."""
    return status.patch_body(status.compute(s, deployments, status.parse_previous(previous)))


def invalid(generation: int | None, message: str, previous: dict[str, Any] | None) -> dict[str, Any]:
    return status.patch_body(status.invalid(generation, message, status.parse_previous(previous)))


# --- Ready ------------------------------------------------------------------------------------------------------


def test_all_ready_and_updated_is_ready() -> None:
    st = compute(all_ready())
    c = conds(st)
    assert [x["type"] for x in st["conditions"]] == [
        "Ready",
        "ConfigValid",
        "PrefillReady",
        "DecodeReady",
        "RouterReady",
        "Progressing",
        "FabricReady",
        "KVTransferHealthy",
        "DisaggregationVerified",
    ]
    assert set(c) == set(CONDITION_TYPES)
    assert (c["Ready"]["status"], c["Ready"]["reason"]) == ("True", "AllComponentsReady")
    assert all(c[t]["status"] == "True" for t in ("ConfigValid", "PrefillReady", "DecodeReady", "RouterReady"))
    assert (c["Progressing"]["status"], c["Progressing"]["reason"]) == ("False", "Stable")


@pytest.mark.parametrize("workload", WORKLOADS)
def test_one_workload_not_ready_means_not_ready(workload: str) -> None:
    deployments = all_ready()
    deployments[workload] = dep(1, ready=0)
    c = conds(compute(deployments))
    assert c["Ready"]["status"] == "False" and c["Ready"]["reason"] == "ComponentsNotReady"
    name = {"prefill": "PrefillReady", "decode": "DecodeReady", "router": "RouterReady"}[workload]
    assert c[name]["status"] == "False" and c[name]["reason"] == "ReplicasNotReady"
    assert c["Ready"]["message"] == f"not ready: {name}"
    others = [n for n in ("PrefillReady", "DecodeReady", "RouterReady") if n != name]
    assert all(c[n]["status"] == "True" for n in others)


@pytest.mark.parametrize("workload", WORKLOADS)
def test_missing_deployment_means_not_ready(workload: str) -> None:
    deployments = all_ready()
    deployments[workload] = None
    c = conds(compute(deployments))
    name = {"prefill": "PrefillReady", "decode": "DecodeReady", "router": "RouterReady"}[workload]
    assert (c[name]["status"], c[name]["reason"]) == ("False", "NotCreated")
    assert c["Ready"]["status"] == "False"
    assert c["Progressing"]["status"] == "True"


def test_nothing_created_yet() -> None:
    st = compute({})
    c = conds(st)
    assert c["Ready"]["status"] == "False"
    assert c["Ready"]["message"] == "not ready: PrefillReady, DecodeReady, RouterReady"
    assert st["prefill"] == {"replicas": 1, "readyReplicas": 0, "updatedReplicas": 0, "summary": "0/1"}


def test_ready_but_not_updated_is_not_ready() -> None:
    deployments = all_ready()
    deployments["decode"] = dep(2, ready=2, updated=1, total=2)
    s = serving({"decode": {"replicas": 2}})
    c = conds(compute(deployments, s=s))
    assert c["DecodeReady"]["status"] == "False" and c["Ready"]["status"] == "False"
    assert c["DecodeReady"]["message"] == "1/2 decode pods updated, 1 old still running"
    assert (c["Progressing"]["status"], c["Progressing"]["reason"]) == ("True", "RollingOut")
    assert c["Progressing"]["message"] == "rolling out: decode"


def test_stale_observed_generation_counts_no_pod_as_updated() -> None:
    deployments = all_ready()
    deployments["prefill"] = dep(1, generation=3, observed=2)  # the controller has not seen the new template yet
    st = compute(deployments)
    assert st["prefill"]["updatedReplicas"] == 0 and st["prefill"]["readyReplicas"] == 1
    c = conds(st)
    assert c["PrefillReady"]["status"] == "False" and c["Ready"]["status"] == "False"
    assert c["Progressing"]["status"] == "True" and "prefill" in c["Progressing"]["message"]


def test_deployment_without_status_is_not_ready() -> None:
    deployments = all_ready()
    deployments["router"] = {"metadata": {"generation": 1}, "spec": {"replicas": 1}}
    st = compute(deployments)
    assert st["router"] == {"replicas": 1, "readyReplicas": 0, "updatedReplicas": 0, "summary": "0/1"}
    assert conds(st)["RouterReady"]["status"] == "False"


def test_scaled_to_zero_is_not_ready() -> None:
    s = serving({"decode": {"replicas": 0}})
    deployments = all_ready()
    deployments["decode"] = dep(0)
    c = conds(compute(deployments, s=s))
    assert (c["DecodeReady"]["status"], c["DecodeReady"]["reason"]) == ("False", "ScaledToZero")
    assert c["Ready"]["status"] == "False"


# --- per-role summaries and the rest of the status --------------------------------------------------------------


def test_per_role_summaries_use_the_spec_replicas() -> None:
    s = serving(
        {
            "prefill": {"replicas": 2},
            "decode": {"replicas": 3},
            "router": {"replicas": 2, "store": {"type": "redis", "redis": {"url": "redis://r"}}},
        }
    )
    st = compute({"prefill": dep(2, ready=1, updated=2), "decode": dep(3, ready=3), "router": dep(2, ready=0)}, s=s)
    assert st["prefill"] == {"replicas": 2, "readyReplicas": 1, "updatedReplicas": 2, "summary": "1/2"}
    assert st["decode"] == {"replicas": 3, "readyReplicas": 3, "updatedReplicas": 3, "summary": "3/3"}
    assert st["router"] == {"replicas": 2, "readyReplicas": 0, "updatedReplicas": 2, "summary": "0/2"}


def test_status_carries_endpoint_effective_kv_hash_and_generation() -> None:
    s = serving({"kvTransfer": {"recomputeThreshold": 32}}, name="qwen", namespace="inference")
    s = type(s)(name=s.name, namespace=s.namespace, spec=s.spec, generation=4)
    st = compute(all_ready(), s=s)
    assert st["observedGeneration"] == 4
    assert all(c["observedGeneration"] == 4 for c in st["conditions"])
    assert st["routerEndpoint"] == "http://qwen-router.inference.svc:8000"
    assert (
        st["effectiveKV"] == effective(s.spec).model_dump(by_alias=True)
        and st["effectiveKV"]["recomputeThreshold"] == 32
    )
    assert st["engineConfigHash"] == engine_config_hash(s.spec, "qwen", "inference")


def test_status_fits_the_status_model_and_schema() -> None:
    s = type(SERVING)(name="qwen", namespace="inference", spec=SERVING.spec, generation=3)
    st = compute(all_ready(), s=s)
    parsed = DisaggregatedServingStatus.model_validate(st)
    assert status.patch_body(parsed) == st
    assert st["effectiveKV"]["recomputeCalibration"] is None  # the merge patch's null: no calibration without Auto


# --- transition times -------------------------------------------------------------------------------------------


def test_last_transition_time_kept_while_status_holds(clock: list[str]) -> None:
    first = compute(all_ready())
    assert all(c["lastTransitionTime"] == T0 for c in first["conditions"])
    clock[0] = T1
    second = compute(all_ready(), previous=first)
    assert second == first
    assert not status.differs(first, second)


def test_last_transition_time_moves_only_for_changed_conditions(clock: list[str]) -> None:
    first = compute(all_ready())
    clock[0] = T1
    broken = all_ready()
    broken["router"] = dep(1, ready=0)
    second = compute(broken, previous=first)
    c = conds(second)
    assert c["RouterReady"]["lastTransitionTime"] == T1 and c["Ready"]["lastTransitionTime"] == T1
    assert c["PrefillReady"]["lastTransitionTime"] == T0 and c["ConfigValid"]["lastTransitionTime"] == T0
    assert c["Progressing"]["lastTransitionTime"] == T0
    assert status.differs(first, second)
    clock[0] = T2
    third = compute(broken, previous=second)
    assert third == second  # a message-only refresh would keep the time as well
    assert not status.differs(second, third)


def test_message_change_without_status_change_keeps_the_time(clock: list[str]) -> None:
    deployments = all_ready()
    deployments["decode"] = dep(2, ready=0, updated=2)
    s = serving({"decode": {"replicas": 2}})
    first = compute(deployments, s=s)
    clock[0] = T1
    deployments["decode"] = dep(2, ready=1, updated=2)
    second = compute(deployments, previous=first, s=s)
    c1, c2 = conds(first), conds(second)
    assert c1["DecodeReady"]["message"] != c2["DecodeReady"]["message"]
    assert c2["DecodeReady"]["lastTransitionTime"] == T0
    assert status.differs(first, second)


def test_progressing_during_a_roll(clock: list[str]) -> None:
    s = serving({"prefill": {"replicas": 2}})
    stable = compute({"prefill": dep(2), "decode": dep(1), "router": dep(1)}, s=s)
    assert conds(stable)["Progressing"]["status"] == "False"
    clock[0] = T1
    rolling = compute(
        {"prefill": dep(2, ready=2, updated=1, generation=2, total=3), "decode": dep(1), "router": dep(1)},
        previous=stable,
        s=s,
    )
    c = conds(rolling)
    assert (c["Progressing"]["status"], c["Progressing"]["reason"]) == ("True", "RollingOut")
    assert c["Progressing"]["lastTransitionTime"] == T1
    assert c["Ready"]["status"] == "False"
    clock[0] = T2
    done = compute({"prefill": dep(2, generation=2), "decode": dep(1), "router": dep(1)}, previous=rolling, s=s)
    c = conds(done)
    assert c["Progressing"]["status"] == "False" and c["Progressing"]["lastTransitionTime"] == T2
    assert c["Ready"]["status"] == "True"


# --- refused spec -----------------------------------------------------------------------------------------------


def test_invalid_spec_status(clock: list[str]) -> None:
    st = invalid(5, "spec: bad ttl", None)
    assert st["observedGeneration"] == 5
    c = conds(st)
    assert set(c) == {"Ready", "ConfigValid"}
    for t in ("Ready", "ConfigValid"):
        assert (c[t]["status"], c[t]["reason"], c[t]["message"]) == ("False", "ConfigInvalid", "spec: bad ttl")
        assert c[t]["observedGeneration"] == 5 and c[t]["lastTransitionTime"] == T0


def test_invalid_spec_keeps_the_role_conditions_and_last_good_fields(clock: list[str]) -> None:
    good = compute(all_ready())
    clock[0] = T1
    st = invalid(2, "spec: broken", good)
    c = conds(st)
    assert (c["Ready"]["status"], c["Ready"]["lastTransitionTime"]) == ("False", T1)
    assert (c["ConfigValid"]["status"], c["ConfigValid"]["lastTransitionTime"]) == ("False", T1)
    for t in ("PrefillReady", "DecodeReady", "RouterReady", "Progressing"):
        assert c[t] == conds(good)[t]
    assert status.differs(good, st)
    # fields it does not set are left alone by a merge patch: differs only looks at what is written
    assert set(st) == {"observedGeneration", "conditions"}
    clock[0] = T2
    again = invalid(2, "spec: broken", {**good, **st})
    assert conds(again)["Ready"]["lastTransitionTime"] == T1
    assert not status.differs({**good, **st}, again)


def test_valid_again_after_invalid(clock: list[str]) -> None:
    bad = invalid(2, "spec: broken", None)
    clock[0] = T1
    fixed = compute(all_ready(), previous=bad)
    c = conds(fixed)
    assert c["ConfigValid"]["status"] == "True" and c["ConfigValid"]["lastTransitionTime"] == T1
    assert c["Ready"]["status"] == "True" and c["Ready"]["lastTransitionTime"] == T1


# --- differs ----------------------------------------------------------------------------------------------------


def test_differs() -> None:
    new = {"observedGeneration": 1, "conditions": [{"type": "Ready", "status": "True"}]}
    assert status.differs(None, new)
    assert status.differs({}, new)
    assert not status.differs(dict(new), new)
    assert not status.differs({**new, "somethingElse": 1}, new)  # keys not written are not compared
    assert status.differs({**new, "observedGeneration": 2}, new)
    assert status.differs({**new, "conditions": [{"type": "Ready", "status": "False"}]}, new)


def test_deployment_names() -> None:
    assert status.deployment_names(SERVING) == {
        "prefill": "qwen-prefill",
        "decode": "qwen-decode",
        "router": "qwen-router",
    }


# --- KVTransferHealthy ------------------------------------------------------------------------------------------

AT = "2026-01-01T00:10:00Z"


def report(healthy: bool, message: str = "KV transfers at 2.00-2.50 GB/s (LIBFABRIC)", at: str = "2026-01-01T00:09:00Z",
           measured: bool = True) -> str:  # fmt: skip
    return json.dumps({"healthy": healthy, "measured": measured, "message": message, "backend": "LIBFABRIC", "at": at})


SLOW = (
    "KV transfers at 0.30 GB/s on prefill http://10.0.0.1:8000, below the 1 GB/s expected of LIBFABRIC: TCP fallback?"
)


@pytest.mark.parametrize(
    ("reports", "expected"),
    [
        ({}, ("Unknown", "NoReports")),
        ({"r-1": report(True, at="2026-01-01T00:00:00Z")}, ("True", "TransfersHealthy")),  # exactly the max age
        ({"r-1": report(False, SLOW, at="2025-12-31T23:59:59Z")}, ("Unknown", "NoReports")),  # too old to count
        ({"r-1": report(True, "no KV transfers measured yet", measured=False)}, ("Unknown", "NotMeasured")),
        ({"r-1": report(True), "r-2": report(False, SLOW)}, ("False", "TransfersDegraded")),
        ({"r-1": report(True), "r-2": report(True, measured=False)}, ("True", "TransfersHealthy")),
        ({"r-1": "not json", "r-2": json.dumps({"healthy": "yes"}), "r-3": report(True)}, ("True", "TransfersHealthy")),
    ],
    ids=[
        "none",
        "fresh and healthy",
        "stale",
        "nothing measured",
        "one router sees it slow",
        "one measured",
        "junk ignored",
    ],
)
def test_kv_transfer_healthy_from_the_routers_reports(reports: dict[str, str], expected: tuple[str, str]) -> None:
    got = status.kv_transfer(reports, AT)
    assert got[:2] == expected
    if expected[1] == "TransfersDegraded":
        assert got[2] == f"router r-2: {SLOW}"


def test_the_condition_names_the_router_and_carries_its_message() -> None:
    st = status.patch_body(
        status.compute(
            SERVING,
            all_ready(),
            None,
            AT,
            fabric_reports={"q-router-1": report(False, SLOW), "q-router-2": report(False)},
        )
    )
    c = conds(st)["KVTransferHealthy"]
    assert (c["status"], c["reason"]) == ("False", "TransfersDegraded")
    assert c["message"] == f"router q-router-1: {SLOW} (and 1 more routers)"
    assert conds(st)["Ready"]["status"] == "True", "transfer health is reported beside readiness, not folded into it"


# --- Starting: pods not ready within the Deployment's progress deadline ------------------------------------------


def progressing(deployment: dict[str, Any], status: str, reason: str) -> dict[str, Any]:
    deployment["status"]["conditions"] = [{"type": "Progressing", "status": status, "reason": reason}]
    return deployment


@pytest.mark.parametrize(
    ("condition", "reason"),
    [
        (("True", "NewReplicaSetCreated"), "Starting"),
        (("True", "ReplicaSetUpdated"), "Starting"),
        (("True", "FoundNewReplicaSet"), "Starting"),
        (("False", "ProgressDeadlineExceeded"), "ReplicasNotReady"),
        # The rollout completed earlier and a pod broke since: failing, not starting.
        (("True", "NewReplicaSetAvailable"), "ReplicasNotReady"),
    ],
)
def test_a_role_not_ready_is_starting_only_within_the_progress_deadline(condition, reason) -> None:
    deployments = all_ready()
    deployments["decode"] = progressing(dep(1, ready=0), *condition)
    c = conds(compute(deployments))
    assert (c["DecodeReady"]["status"], c["DecodeReady"]["reason"]) == ("False", reason)
    assert c["Ready"]["status"] == "False"


def test_a_deployment_the_controller_has_not_seen_is_starting() -> None:
    deployments = all_ready()
    deployments["prefill"] = dep(1, ready=0, generation=2, observed=1)
    assert conds(compute(deployments))["PrefillReady"]["reason"] == "Starting"


# --- DisaggregationVerified: the routers' canaries --------------------------------------------------------------

P, D = "http://10.0.0.1:8000", "http://10.0.0.2:8000"
PODS = [
    {"metadata": {"labels": {"duplex.dev/serving": "qwen", "duplex.dev/role": role}}, "status": {"podIP": ip}}
    for role, ip in (("prefill", "10.0.0.1"), ("decode", "10.0.0.2"))
]
PASSED = "prefill computed 250 tokens, decode read them (1024 bytes), prefill read 253 back (1056 bytes)"


def canary_report(ok: bool, step: str = "done", message: str = PASSED, prefill: str = P, decode: str = D,
                  at: str = "2026-01-01T00:09:00Z") -> str:  # fmt: skip
    canary = {"ok": ok, "step": step, "message": message, "prefill": prefill, "decode": decode, "run": 1}
    return json.dumps({"healthy": True, "measured": True, "message": "", "backend": "UCX", "at": at, "canary": canary})


IPS = {"10.0.0.1", "10.0.0.2"}


@pytest.mark.parametrize(
    ("reports", "expected"),
    [
        ({}, ("Unknown", "Pending")),
        ({"r-1": report(True)}, ("Unknown", "Pending")),  # a router without a canary result yet
        ({"r-1": canary_report(True)}, ("True", "Verified")),
        ({"r-1": canary_report(True, prefill="http://10.9.9.9:8000")}, ("Unknown", "Pending")),  # before a rollout
        ({"r-1": canary_report(True, at="2025-12-31T23:59:59Z")}, ("Unknown", "Pending")),  # too old to count
        (
            {"r-1": canary_report(True), "r-2": canary_report(False, "retained", "retained: no")},
            ("False", "DecodeKeptNoBlocks"),
        ),
        ({"r-1": canary_report(False, "p_to_d", "p_to_d: no")}, ("False", "DecodeDidNotReadPrefill")),
        ({"r-1": canary_report(False, "d_to_p", "d_to_p: no")}, ("False", "PrefillDidNotReadBack")),
        ({"r-1": canary_report(False, "prefill", "prefill: no")}, ("False", "PrefillComputedNothing")),
        ({"r-1": canary_report(False, "receipt", "receipt: no")}, ("False", "ReceiptDisagrees")),
        ({"r-1": canary_report(False, "error", "could not run")}, ("False", "CanaryFailed")),
        ({"r-1": canary_report(False, "d_to_p", prefill="http://10.9.9.9:8000")}, ("Unknown", "Pending")),
    ],
    ids=[
        "none",
        "no result",
        "passed",
        "old pods",
        "stale",
        "one router fails",
        "p to d",
        "d to p",
        "prefill",
        "receipt",
        "error",
        "old failure",
    ],
)
def test_disaggregation_verified_from_the_canaries_on_the_current_pods(
    reports: dict[str, str], expected: tuple[str, str]
) -> None:
    assert status.disaggregation_verified(True, reports, IPS, AT)[:2] == expected


def test_the_verified_condition_names_router_and_engines_and_never_touches_ready() -> None:
    failed = canary_report(False, "d_to_p", "d_to_p: prefill recomputed instead of reading decode's blocks")
    st = status.patch_body(status.compute(SERVING, all_ready(), None, AT, pods=PODS, fabric_reports={"q-r-1": failed}))
    c = conds(st)["DisaggregationVerified"]
    assert (c["status"], c["reason"]) == ("False", "PrefillDidNotReadBack")
    assert c["message"] == f"router q-r-1, prefill {P}, decode {D}: d_to_p: prefill recomputed instead of reading " \
        "decode's blocks"  # fmt: skip
    assert conds(st)["Ready"]["status"] == "True"
    ok = status.compute(SERVING, all_ready(), None, AT, pods=PODS, fabric_reports={"q-r-1": canary_report(True)})
    c = conds(status.patch_body(ok))["DisaggregationVerified"]
    assert (c["status"], c["reason"], c["message"]) == ("True", "Verified", f"router q-r-1: {PASSED}")


def test_pods_being_deleted_do_not_count_as_current() -> None:
    leaving = [{**p, "metadata": {**p["metadata"], "deletionTimestamp": T0}} for p in PODS]
    assert status.engine_ips("qwen", leaving) == set()
    assert status.engine_ips("qwen", PODS) == IPS
    assert status.engine_ips("other", PODS) == set()


def test_a_disabled_canary_is_not_checked() -> None:
    assert status.disaggregation_verified(False, {"r-1": canary_report(True)}, IPS, AT)[:2] == ("Unknown", "NotChecked")

"""sync(parent, observed, previous): the operator's whole decision in one pure call, as a table of cases (spec +
observed children + previous status -> children to apply, children to delete, the status, the Events); then the
rules the table leans on: a refused spec leaves children untouched, only this parent's children are ever deleted,
orphans with a desired name are adopted, and the applied objects are what `duplex render` prints."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import pytest
from sync_helpers import (
    BAD,
    FIRST,
    KEY_SECRET,
    KEY_UID,
    LIVE,
    LIVE_LOADING,
    LOADING,
    READY,
    SCALED,
    T0,
    T1,
    UID,
    Objects,
    P,
    edit,
    parent,
    refs,
    stale,
)

from duplex import status
from duplex.converge import APPLIED_HASH
from duplex.render import desired_children, parse
from duplex.sync import Event, SyncResult, sync


def conditions(result: SyncResult) -> dict[str, tuple[str, str]]:
    return {c.type: (c.status, c.reason) for c in result.status.conditions}


# --- the table --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    name: str
    parent: dict[str, Any]
    observed: Objects
    previous: dict[str, Any] | None
    apply: list[str]
    delete: list[str]
    write_status: bool
    conditions: dict[str, tuple[str, str]]  # the conditions that matter for the case
    events: list[tuple[str, str]] = field(default_factory=list)  # (type, reason)
    create: list[str] = field(default_factory=list)


CASES = [
    Case(
        "new parent: the key Secret created, everything but the workloads applied in table order (they wait for the "
        "key), status says nothing exists yet",
        P, [], None,
        apply=FIRST, delete=[], write_status=True,
        conditions={"Ready": ("False", "ComponentsNotReady"), "PrefillReady": ("False", "NotCreated"),
                    "ConfigValid": ("True", "Valid")},
        create=[KEY_SECRET],
    ),
    Case(
        "converged and ready, status already written: nothing to do",
        P, LIVE, READY,
        apply=[], delete=[], write_status=False,
        conditions={"Ready": ("True", "AllComponentsReady"), "Progressing": ("False", "Stable")},
    ),
    Case(
        "pods became ready: status written, a Ready event, no child touched",
        P, LIVE, LOADING,
        apply=[], delete=[], write_status=True,
        conditions={"Ready": ("True", "AllComponentsReady"), "DecodeReady": ("True", "AllReplicasReady")},
        events=[("Normal", "Ready")],
    ),
    Case(
        "pods stopped being ready: a NotReady warning",
        P, LIVE_LOADING, READY,
        apply=[], delete=[], write_status=True,
        conditions={"Ready": ("False", "ComponentsNotReady"), "RouterReady": ("False", "ReplicasNotReady")},
        events=[("Warning", "NotReady")],
    ),
    Case(
        "someone scaled a Deployment: only that child is applied back",
        P, edit(LIVE, "Deployment/demo-decode", lambda d: d["spec"].update(replicas=3)), READY,
        apply=["Deployment/demo-decode"], delete=[], write_status=False,
        conditions={"Ready": ("True", "AllComponentsReady")},
        events=[("Warning", "ReplicasOverwritten")],
    ),
    Case(
        "a deleted child is recreated",
        P, [o for o in LIVE if (o["kind"], o["metadata"]["name"]) != ("ConfigMap", "demo-router")], READY,
        apply=["ConfigMap/demo-router"], delete=[], write_status=False,
        conditions={"Ready": ("True", "AllComponentsReady")},
    ),
    Case(
        "spec scaled: the Deployment follows, status counts the new desired replicas",
        SCALED, LIVE, READY,
        apply=["Deployment/demo-decode"], delete=[], write_status=True,
        conditions={"Ready": ("False", "ComponentsNotReady"), "DecodeReady": ("False", "ReplicasNotReady")},
        events=[("Warning", "NotReady")],
    ),
    Case(
        "children this parent owns but no longer wants are deleted, Deployments first",
        P, LIVE + [stale("ConfigMap", "v1", "demo-old", UID), stale("Deployment", "apps/v1", "demo-extra", UID)],
        READY,
        apply=[], delete=["Deployment/demo-extra", "ConfigMap/demo-old"], write_status=False,
        conditions={"Ready": ("True", "AllComponentsReady")},
    ),
    Case(
        "children owned by someone else, or by no one, are never deleted",
        P, LIVE + [stale("Service", "v1", "theirs", "uid-2"), stale("Service", "v1", "hand-made", None)], READY,
        apply=[], delete=[], write_status=False,
        conditions={"Ready": ("True", "AllComponentsReady")},
    ),
    Case(
        "an orphan with a desired name is adopted: applied with this parent as its controller",
        P, edit(LIVE, "Service/demo-router", lambda s: s["metadata"].pop("ownerReferences")), READY,
        apply=["Service/demo-router"], delete=[], write_status=False,
        conditions={"Ready": ("True", "AllComponentsReady")},
    ),
    Case(
        "children on their way out are neither deleted again nor re-applied",
        P,
        edit(LIVE, "Role/demo-router", lambda r: r["metadata"].update(deletionTimestamp=T0, finalizers=["x"]))
        + [{**stale("ConfigMap", "v1", "demo-old", UID), "metadata": {
            **stale("ConfigMap", "v1", "demo-old", UID)["metadata"], "deletionTimestamp": T0}}],
        READY,
        apply=[], delete=[], write_status=False,
        conditions={"Ready": ("True", "AllComponentsReady")},
    ),
    Case(
        "a refused spec: ConfigValid=False with a warning, children untouched (stale ones included)",
        BAD, LIVE + [stale("ConfigMap", "v1", "demo-old", UID)], READY,
        apply=[], delete=[], write_status=True,
        conditions={"Ready": ("False", "ConfigInvalid"), "ConfigValid": ("False", "ConfigInvalid"),
                    "PrefillReady": ("True", "AllReplicasReady")},
        events=[("Warning", "ConfigInvalid")],
    ),
    Case(
        "a refused spec already reported: nothing written, no repeated warning",
        BAD, LIVE, {**READY, **status.patch_body(sync(BAD, LIVE, READY, at=T0).status)},
        apply=[], delete=[], write_status=False,
        conditions={"Ready": ("False", "ConfigInvalid"), "ConfigValid": ("False", "ConfigInvalid")},
    ),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_sync(case: Case) -> None:
    result = sync(case.parent, case.observed, case.previous, at=T1)
    assert refs(result.apply) == case.apply
    assert refs(result.create) == case.create
    assert refs(result.delete) == case.delete
    assert result.write_status is case.write_status
    got = conditions(result)
    assert {t: got.get(t) for t in case.conditions} == case.conditions
    assert [(e.type, e.reason) for e in result.events] == case.events


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_sync_is_pure_and_repeatable(case: Case) -> None:
    before = copy.deepcopy((case.parent, case.observed, case.previous))
    first = sync(case.parent, case.observed, case.previous, at=T1)
    assert (case.parent, case.observed, case.previous) == before  # inputs untouched
    assert sync(case.parent, case.observed, case.previous, at=T1) == first


# --- the rules behind the table ---------------------------------------------------------------------------------


def test_applied_children_are_owned_by_the_parent_and_stamped() -> None:
    result = sync(P, [], None, at=T0)
    for obj in result.apply:
        (ref,) = obj["metadata"]["ownerReferences"]
        assert (ref["kind"], ref["uid"], ref["controller"], ref["blockOwnerDeletion"]) == (
            "DisaggregatedServing",
            UID,
            True,
            True,
        )
        assert obj["metadata"]["annotations"][APPLIED_HASH]


def test_what_users_preview_is_what_the_cluster_gets() -> None:
    """`duplex render` prints desired_children; the operator applies exactly those, plus owner and hash."""

    def unowned(obj: dict[str, Any]) -> dict[str, Any]:
        obj = copy.deepcopy(obj)
        meta = obj["metadata"]
        del meta["ownerReferences"]
        meta["annotations"].pop(APPLIED_HASH)
        if not meta["annotations"]:
            del meta["annotations"]
        return obj

    (secret,) = [o for o in LIVE if o["kind"] == "Secret"]
    applied = [unowned(o) for o in sync(P, [secret], None, at=T0).apply]
    assert applied == desired_children(parse(P), KEY_UID)
    # ... which is the preview with the key Secret's uid on the workloads' pod templates
    for got, preview in zip(applied, desired_children(parse(P)), strict=True):
        if got["kind"] == "Deployment":
            got["spec"]["template"]["metadata"]["annotations"].pop("duplex.dev/engine-key-uid")
            if not got["spec"]["template"]["metadata"]["annotations"]:
                del got["spec"]["template"]["metadata"]["annotations"]
        assert got == preview


def test_a_refused_spec_reports_the_admission_message_and_keeps_the_last_good_counts() -> None:
    result = sync(BAD, LIVE, READY, at=T1)
    assert result.invalid and "router.conversation.ttl must be strictly below kvTransfer.decodeBlocksTTL" in (
        result.invalid
    )
    body = status.patch_body(result.status)
    assert set(body) == {"observedGeneration", "conditions"}  # a merge patch: prefill/decode/router counts stay
    (warning,) = result.events
    assert warning == Event("Warning", "ConfigInvalid", result.invalid)


def test_transition_times_come_from_the_caller_and_hold_while_a_condition_does() -> None:
    first = sync(P, LIVE_LOADING, None, at=T0)
    assert {c.last_transition_time for c in first.status.conditions} == {T0}
    later = sync(P, LIVE, status.patch_body(first.status), at=T1)
    times = {c.type: c.last_transition_time for c in later.status.conditions}
    assert times["Ready"] == T1 and times["ConfigValid"] == T0


def test_a_status_that_no_longer_parses_is_replaced() -> None:
    junk = {"conditions": [{"type": "Ready", "status": "Maybe"}]}
    result = sync(P, LIVE, junk, at=T1)
    assert result.write_status and result.ready


# --- the engine key Secret: created once, never changed --------------------------------------------------------


def test_the_key_secret_is_created_when_missing_and_the_core_never_holds_a_key() -> None:
    (secret,) = sync(P, [], None, at=T0).create
    assert refs([secret]) == [KEY_SECRET] and secret["type"] == "Opaque"
    assert "data" not in secret and "stringData" not in secret  # the shell draws the key
    assert secret["metadata"]["ownerReferences"][0]["uid"] == UID
    assert secret["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "duplex"  # the watch's selector


def test_an_existing_key_secret_is_never_applied_again_whatever_it_holds() -> None:
    rotated = edit(LIVE, KEY_SECRET, lambda s: s.update(data={"api-key": "b3RoZXI="}))
    relabelled = edit(LIVE, KEY_SECRET, lambda s: s["metadata"]["labels"].update(extra="x"))
    for observed_now in (LIVE, rotated, relabelled):
        result = sync(P, observed_now, READY, at=T1)
        assert (result.apply, result.create, result.delete, result.events) == ([], [], [], [])


def test_a_deleted_key_secret_is_created_again_once_it_is_gone() -> None:
    without = [o for o in LIVE if o["kind"] != "Secret"]
    result = sync(P, without, READY, at=T1)
    assert refs(result.create) == [KEY_SECRET] and result.apply == []
    assert result.events == []  # the shell names what it wrote (test_reconcile.py)
    leaving = edit(LIVE, KEY_SECRET, lambda s: s["metadata"].update(deletionTimestamp=T0))
    assert sync(P, leaving, READY, at=T1).create == []


def test_a_refused_spec_creates_no_key() -> None:
    assert sync(BAD, [], None, at=T0).create == []


def test_workloads_read_the_key_from_the_secret() -> None:
    secret = [o for o in LIVE if o["kind"] == "Secret"]
    apply = {f"{o['kind']}/{o['metadata']['name']}": o for o in sync(P, secret, None, at=T0).apply}
    ref = {"secretKeyRef": {"name": "demo-engine-key", "key": "api-key"}}
    for name, var in (
        ("demo-prefill", "VLLM_API_KEY"),
        ("demo-decode", "VLLM_API_KEY"),
        ("demo-router", "DUPLEX_ENGINE_API_KEY"),
    ):
        template = apply[f"Deployment/{name}"]["spec"]["template"]
        (container,) = template["spec"]["containers"]
        assert {"name": var, "valueFrom": ref} in container["env"]
        assert template["metadata"]["annotations"]["duplex.dev/engine-key-uid"] == KEY_UID
    assert KEY_SECRET not in apply


def test_turning_policies_off_deletes_them() -> None:
    off = parent({"network": {"networkPolicy": {"enabled": False}}})
    result = sync(off, LIVE, READY, at=T1)
    assert sorted(refs(result.delete)) == [
        "NetworkPolicy/demo-decode",
        "NetworkPolicy/demo-prefill",
        "NetworkPolicy/demo-router",
    ]
    assert result.apply == [] and result.create == []


def test_a_new_key_rolls_engines_and_router_together_once_it_exists() -> None:
    """A Secret made again holds a new key: until it exists the workloads stay as they are, then all three roll
    to pods that read it."""
    without = [o for o in LIVE if o["kind"] != "Secret"]
    waiting = sync(P, without, READY, at=T1)
    assert refs(waiting.create) == [KEY_SECRET] and waiting.apply == []
    renewed = edit(LIVE, KEY_SECRET, lambda s: s["metadata"].update(uid="uid-new-secret"))
    rolled = sync(P, renewed, READY, at=T1)
    assert refs(rolled.apply) == ["Deployment/demo-prefill", "Deployment/demo-decode", "Deployment/demo-router"]
    for d in rolled.apply:
        assert d["spec"]["template"]["metadata"]["annotations"]["duplex.dev/engine-key-uid"] == "uid-new-secret"

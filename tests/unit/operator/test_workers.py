"""The workers between the watch caches and a pass: what they read from the caches, when a parent comes round
again (resync, backoff by failure kind, never once it is gone), and the kopf shell's owner mapping."""

from __future__ import annotations

from typing import Any

import pytest
from sync_helpers import LIVE, READY, UID, P, RecordingKube

from duplex import metrics
from duplex.apierrors import ApiError
from duplex.handlers import owner_uids
from duplex.workers import MAX_BACKOFF_SECONDS, SETTLE_SECONDS, Caches, Workers, retry_delay
from duplex.workqueue import WorkQueue

RESYNC = 60.0


@pytest.mark.parametrize(
    "err,failures,delay",
    [
        (ApiError(409, "Conflict"), 1, 1),
        (ApiError(409, "Conflict"), 2, 2),
        (ApiError(None), 4, 8),
        (ApiError(503), 30, MAX_BACKOFF_SECONDS),
        (ApiError(429, "TooManyRequests", retry_after=20), 1, 20),  # no sooner than the server asks
        (ApiError(429, "TooManyRequests", retry_after=1), 5, 16),
        (ApiError(403, "Forbidden", causes=("NamespaceTerminating",)), 3, RESYNC),
        (ApiError(404, "NotFound"), 1, RESYNC),
        (ApiError(422, "Invalid"), 3, 4),
    ],
)
def test_retry_delay(err: ApiError, failures: int, delay: float) -> None:
    assert retry_delay(err, failures, RESYNC) == delay


def caches(parents: dict[str, list[dict[str, Any]]], *children: dict[str, list[dict[str, Any]]]) -> Caches:
    return Caches(servings=parents, children=children)


def test_caches_read_a_parent_and_every_kind_of_its_children() -> None:
    deployments = {UID: [o for o in LIVE if o["kind"] == "Deployment"], "other": [{"kind": "Deployment"}]}
    services = {UID: [o for o in LIVE if o["kind"] == "Service"]}
    c = caches({UID: [P]}, deployments, services, {})
    assert c.parent(UID) is P and c.parent("gone") is None
    assert [o["kind"] for o in c.observed(UID)] == ["Deployment"] * 3 + ["Service"] * 4
    assert c.observed("gone") == []


def workers(c: Caches, kube: RecordingKube) -> Workers:
    return Workers(WorkQueue(), c, kube, RESYNC)  # type: ignore[arg-type]


async def test_a_pass_that_wrote_lets_the_watch_catch_up_then_resyncs() -> None:
    kube = RecordingKube()
    w = workers(caches({UID: [P]}, {}), kube)
    assert await w._pass(UID) == (SETTLE_SECONDS, RESYNC)
    assert kube.calls


async def test_an_idle_pass_resyncs_without_a_hold() -> None:
    kube = RecordingKube()
    by_kind: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for o in LIVE:
        by_kind.setdefault(o["kind"], {}).setdefault(UID, []).append(o)
    w = workers(caches({UID: [{**P, "status": READY}]}, *by_kind.values()), kube)
    assert await w._pass(UID) == (0.0, RESYNC)
    assert kube.calls == []


async def test_failures_back_off_and_a_success_resets_them() -> None:
    kube = RecordingKube(fail_apply=ApiError(500, "InternalError"))
    w = workers(caches({UID: [P]}, {}), kube)
    assert [(await w._pass(UID))[1] for _ in range(3)] == [1, 2, 4]
    kube.fail_apply = None
    assert (await w._pass(UID))[1] == RESYNC
    kube.fail_apply = ApiError(500, "InternalError")
    assert (await w._pass(UID))[1] == 1


async def test_a_bug_backs_off_like_any_failure() -> None:
    kube = RecordingKube(fail_apply=ApiError(500))
    kube.apply = lambda obj: 1 / 0  # type: ignore[method-assign,assignment,return-value]
    w = workers(caches({UID: [P]}, {}), kube)
    assert await w._pass(UID) == (SETTLE_SECONDS, 1)


async def test_a_gone_parent_is_forgotten_and_never_comes_round_again() -> None:
    kube = RecordingKube()
    parents = {UID: [P]}
    w = workers(caches(parents, {}), kube)
    await w._pass(UID)  # the key Secret first: the Deployments wait for it
    assert metrics.MANAGED_OBJECTS.labels("ns1", "demo", "Secret")._value.get() == 1
    assert metrics.MANAGED_OBJECTS.labels("ns1", "demo", "Service")._value.get() == 4
    w.queue.add(UID, 30)
    del parents[UID]
    assert await w._pass(UID) == (0.0, None)
    assert len(w.queue) == 0
    sample = [s for m in metrics.MANAGED_OBJECTS.collect() for s in m.samples if s.labels.get("serving") == "demo"]
    assert sample == []


@pytest.mark.parametrize(
    "refs,uids",
    [
        ([{"apiVersion": "duplex.dev/v1alpha1", "kind": "DisaggregatedServing", "uid": "a"}], ["a"]),
        ([{"apiVersion": "apps/v1", "kind": "ReplicaSet", "uid": "b"}], []),
        ([{"apiVersion": "other.dev/v1", "kind": "DisaggregatedServing", "uid": "c"}], []),
        (None, []),
    ],
)
def test_children_map_to_parents_by_owner_reference(refs: list[dict[str, str]] | None, uids: list[str]) -> None:
    assert owner_uids({"ownerReferences": refs, "labels": {"duplex.dev/serving": "x"}}) == uids

"""The shell around sync: reconcile_once does what the core decided and nothing else (applies in order, deletes,
writes status only when it changed, posts the core's Events), against a recording stand-in for the API. The real
API server is the integration tier's (tests/integration/test_operator.py)."""

from __future__ import annotations

from typing import Any

import pytest
from sync_helpers import ALL, BAD, KEY_SECRET, LIVE, LOADING, READY, UID, P, RecordingKube, stale

from duplex.apierrors import ApiError, Failure
from duplex.reconcile import ForeignSecret, reconcile_once


def with_status(parent: dict[str, Any], status: dict[str, Any] | None) -> dict[str, Any]:
    return {**parent, "status": status} if status else dict(parent)


def test_a_new_parent_applies_everything_then_writes_status_then_posts_events() -> None:
    # The key Secret first; the API server's answer carries its uid, so the workloads that wait for it go out in
    # the same pass.
    kube = RecordingKube()
    outcome = reconcile_once(kube, P, [])  # type: ignore[arg-type]
    assert kube.calls == [
        ("get", KEY_SECRET),  # Secrets are read by name, never watched
        ("create", KEY_SECRET),
        *(("apply", ref) for ref in ALL),
        ("status", "ns1/demo"),
        ("event", "Normal/Applied"),  # once, though the core ran again after the Secret's create
    ]
    assert outcome.applied == [KEY_SECRET, *ALL] and outcome.wrote and not outcome.ready
    assert kube.messages == [f"converged children: {', '.join([KEY_SECRET, *ALL])}"]
    deployments = [o for o in kube.applied if o["kind"] == "Deployment"]
    assert deployments and all("uid-1" in str(d["spec"]["template"]) for d in deployments)  # they roll with it
    assert kube.created[0]["stringData"]["api-key"] not in str(kube.applied)  # the key never reaches an applied object


def test_the_shell_draws_a_fresh_random_key_and_keeps_an_existing_one() -> None:
    keys = []
    for _ in range(2):
        kube = RecordingKube()
        reconcile_once(kube, P, [])  # type: ignore[arg-type]
        (secret,) = kube.created
        keys.append(secret["stringData"]["api-key"])
    assert keys[0] != keys[1] and min(map(len, keys)) >= 43  # 256 random bits, base64url
    # Read by name, it is there with its key: nothing is created, and the workloads roll with its uid.
    kube = RecordingKube(exists=True)
    outcome = reconcile_once(kube, P, [])  # type: ignore[arg-type]
    assert kube.created == [] and kube.calls[0] == ("get", KEY_SECRET) and outcome.applied == ALL
    assert all("uid-existing" in str(o["spec"]["template"]) for o in kube.applied if o["kind"] == "Deployment")


@pytest.mark.parametrize("owner", [None, "uid-of-another-serving"])
def test_a_key_secret_name_taken_by_someone_else_stops_the_pass_with_a_warning(owner: str | None) -> None:
    kube = RecordingKube(exists=True, owner=owner)
    with pytest.raises(ForeignSecret, match="exists and is not this serving's") as raised:
        reconcile_once(kube, P, [])  # type: ignore[arg-type]
    assert raised.value.failure is Failure.TRANSIENT  # retried with backoff: deleting the Secret lets it go on
    assert kube.applied == []  # no workload waits on a key it cannot have; nothing else half-applied
    assert kube.calls[-1] == ("event", "Warning/EngineKeyConflict")
    (message,) = kube.messages
    assert ("owned by DisaggregatedServing/other" in message) is (owner is not None)
    assert "Delete or rename that Secret" in message


def test_a_converged_parent_makes_no_call_at_all() -> None:
    kube = RecordingKube()
    outcome = reconcile_once(kube, with_status(P, READY), LIVE)  # type: ignore[arg-type]
    assert kube.calls == []
    assert not outcome.wrote and outcome.ready


def test_stale_children_are_deleted_and_status_follows_readiness() -> None:
    kube = RecordingKube()
    observed = LIVE + [stale("Service", "v1", "demo-old", "uid-1")]
    reconcile_once(kube, with_status(P, LOADING), observed)  # type: ignore[arg-type]
    assert kube.calls == [
        ("delete", "Service/demo-old"),
        ("status", "ns1/demo"),
        ("event", "Normal/Applied"),
        ("event", "Normal/Ready"),
    ]


def test_the_applied_event_names_each_child_written() -> None:
    observed = [o for o in LIVE if (o["kind"], o["metadata"]["name"]) != ("ConfigMap", "demo-router")]
    observed += [stale("ConfigMap", "v1", "demo-old", UID)]
    kube = RecordingKube()
    reconcile_once(kube, with_status(P, READY), observed)  # type: ignore[arg-type]
    assert [c for c in kube.calls if c[0] == "event"] == [("event", "Normal/Applied")]
    assert kube.messages == ["converged children: ConfigMap/demo-router, -ConfigMap/demo-old"]


def test_a_refused_spec_only_writes_status_and_warns() -> None:
    kube = RecordingKube()
    outcome = reconcile_once(kube, with_status(BAD, READY), LIVE + [stale("Service", "v1", "demo-old", "uid-1")])  # type: ignore[arg-type]
    assert kube.calls == [("status", "ns1/demo"), ("event", "Warning/ConfigInvalid")]
    assert outcome.invalid and outcome.wrote


def test_api_failures_reach_the_caller() -> None:
    kube = RecordingKube(fail_apply=ApiError(status=409, reason="Conflict"))
    with pytest.raises(ApiError) as err:
        reconcile_once(kube, P, [])  # type: ignore[arg-type]
    assert err.value.status == 409

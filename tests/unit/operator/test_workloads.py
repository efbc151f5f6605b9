"""The workloads of a role whose instances span nodes: the sync core keeps its LeaderWorkerSet, like the
Deployments, until the engine key exists."""

from __future__ import annotations

from sync_helpers import KEY_UID, T1, observed, parent

from duplex.sync import sync

MULTINODE = {
    "network": {"efa": {"enabled": True}},
    "prefill": {"memory": "1Gi"},
    "decode": {"memory": "1Gi", "replicas": 2, "nodesPerInstance": 2, "tensorParallelSize": 8},
}


def test_the_leader_worker_set_waits_for_the_engine_key_like_the_deployments() -> None:
    without_key = [o for o in observed(parent(MULTINODE)) if o["kind"] not in ("Secret", "LeaderWorkerSet")]
    waiting = sync(parent(MULTINODE), without_key, None, at=T1)
    assert [o["kind"] for o in waiting.create] == ["Secret"]
    assert not [o for o in waiting.apply if o["kind"] in ("Deployment", "LeaderWorkerSet")]
    # Once the key exists the set goes out, its pods stamped with the key's uid.
    with_key = [o for o in observed(parent(MULTINODE)) if o["kind"] != "LeaderWorkerSet"]
    (lws,) = [o for o in sync(parent(MULTINODE), with_key, None, at=T1).apply if o["kind"] == "LeaderWorkerSet"]
    for rank in ("leaderTemplate", "workerTemplate"):
        annotations = lws["spec"]["leaderWorkerTemplate"][rank]["metadata"]["annotations"]
        assert annotations["duplex.dev/engine-key-uid"] == KEY_UID

"""The real LeaderWorkerSet controller (duplex_dev.launch.lws) against the local control plane: a LeaderWorkerSet of
one group of two gets its leader and worker StatefulSets and pods, each rank on a p5en node of its own, with the
labels and environment the pod webhook adds, and reports the group ready; a deleted worker brings the whole group
back with a new leader (RecreateGroupOnPodRestart).

The controller runs as conftest.py's `lws` fixture; its binary is built by hack/build-tools.sh, and missing is a
failure, never a skip."""

from __future__ import annotations

import json
from typing import Any

import pytest

pytestmark = pytest.mark.cluster

NAME = "pd"
SET_LABEL = "leaderworkerset.sigs.k8s.io/name"
WORKER_INDEX = "leaderworkerset.sigs.k8s.io/worker-index"
LEADER, WORKER = f"{NAME}-0", f"{NAME}-0-1"  # group 0's leader (StatefulSet `pd`) and its worker (StatefulSet `pd-0`)
# A whole p5en node per rank, as a multi-node vLLM engine asks for it: eight GPUs each, so no two ranks share a node.
RANK_SPEC = {
    "nodeSelector": {"node.kubernetes.io/instance-type": "p5en.48xlarge"},
    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    "terminationGracePeriodSeconds": 0,
}
GPUS = {"nvidia.com/gpu": "8"}
# Held by the test on the deleted worker, as a kubelet holds a pod while its containers stop: without it kwok removes
# the pod within milliseconds, and the controller may find it gone before it sees it terminating (then the worker
# StatefulSet replaces the worker alone, which a real node never lets happen).
HOLD = "duplex.test/hold"


def rank_template(role: str) -> dict[str, Any]:
    container = {"name": role, "image": "vllm", "resources": {"requests": GPUS, "limits": GPUS}}
    return {"metadata": {"labels": {"role": role}}, "spec": {**RANK_SPEC, "containers": [container]}}


LWS = {
    "apiVersion": "leaderworkerset.x-k8s.io/v1",
    "kind": "LeaderWorkerSet",
    "metadata": {"name": NAME},
    "spec": {
        "replicas": 1,
        "leaderWorkerTemplate": {
            "size": 2,
            "restartPolicy": "RecreateGroupOnPodRestart",
            "leaderTemplate": rank_template("leader"),
            "workerTemplate": rank_template("worker"),
        },
    },
}


def group_pods(kubectl, namespace: str) -> dict[str, dict]:
    items = kubectl.json("-n", namespace, "get", "pods", "-l", f"{SET_LABEL}={NAME}")["items"]
    return {p["metadata"]["name"]: p for p in items}


def running_and_ready(pod: dict) -> bool:
    conditions = {c["type"]: c["status"] for c in pod["status"].get("conditions", [])}
    return (
        pod["status"].get("phase") == "Running"
        and conditions.get("Ready") == "True"
        and not pod["metadata"].get("deletionTimestamp")
    )


def group_ready(kubectl, namespace: str, not_uids: frozenset[str] = frozenset()) -> dict[str, dict] | None:
    """Both pods Running and Ready (none of them one of `not_uids`) and the LeaderWorkerSet's status saying so."""
    pods = group_pods(kubectl, namespace)
    if set(pods) != {LEADER, WORKER} or not all(running_and_ready(p) for p in pods.values()):
        return None
    if {p["metadata"]["uid"] for p in pods.values()} & not_uids:
        return None
    status = kubectl.json("-n", namespace, "get", "leaderworkerset", NAME).get("status", {})
    available = any(c["type"] == "Available" and c["status"] == "True" for c in status.get("conditions", []))
    return pods if status.get("readyReplicas") == 1 and available else None


def test_group_is_created_ready_and_recreated_when_a_worker_goes(lws, kubectl, namespace, wait_for):
    kubectl.apply(LWS, namespace)
    pods = wait_for(lambda: group_ready(kubectl, namespace), timeout=120, what="the group's two pods Ready, LWS ready")

    statefulsets = {s["metadata"]["name"] for s in kubectl.json("-n", namespace, "get", "statefulsets")["items"]}
    assert statefulsets == {NAME, LEADER}, "the leader StatefulSet and group 0's worker StatefulSet"
    nodes = {name: pod["spec"]["nodeName"] for name, pod in pods.items()}
    assert len(set(nodes.values())) == 2, f"each rank on a node of its own: {nodes}"
    p5en = kubectl.json("get", "nodes", "-l", "node.kubernetes.io/instance-type=p5en.48xlarge")["items"]
    assert set(nodes.values()) <= {n["metadata"]["name"] for n in p5en}
    # What the pod webhook adds (so it was served and called): the rank label and the leader's address.
    assert pods[LEADER]["metadata"]["labels"][WORKER_INDEX] == "0"
    assert pods[WORKER]["metadata"]["labels"][WORKER_INDEX] == "1"
    env = {e["name"]: e.get("value") for e in pods[WORKER]["spec"]["containers"][0].get("env", [])}
    assert env.get("LWS_LEADER_ADDRESS", "").startswith(f"{LEADER}.{NAME}.{namespace}"), env
    assert env.get("LWS_GROUP_SIZE") == "2", env

    old_uids = frozenset(p["metadata"]["uid"] for p in pods.values())
    leader_uid = pods[LEADER]["metadata"]["uid"]
    hold = json.dumps({"metadata": {"finalizers": [HOLD]}})
    kubectl("-n", namespace, "patch", "pod", WORKER, "--type=merge", "-p", hold)
    try:
        kubectl("-n", namespace, "delete", "pod", WORKER, "--wait=false")

        def leader_going() -> bool:
            leader = group_pods(kubectl, namespace).get(LEADER)
            if leader is None:
                return True
            return bool(leader["metadata"].get("deletionTimestamp")) or leader["metadata"]["uid"] != leader_uid

        wait_for(leader_going, timeout=60, what=f"the controller deleting leader {LEADER} after worker {WORKER} went")
    finally:
        kubectl("-n", namespace, "patch", "pod", WORKER, "--type=merge", "-p", '{"metadata": {"finalizers": null}}')

    pods = wait_for(lambda: group_ready(kubectl, namespace, old_uids), timeout=120, what="a new group Ready")
    assert pods[LEADER]["metadata"]["uid"] != leader_uid

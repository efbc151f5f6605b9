"""The local control plane is a real one: nodes with EFA/GPU allocatable, a scheduler that honours extended resources
and taints, kwok running bound pods, garbage collection, RBAC, an audit log and an apiserver that can restart."""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path

import pytest
import yaml

from duplex_dev.cluster import tools
from duplex_dev.cluster.cli import main as cluster_cli
from duplex_dev.processes import ProcessRecord, is_alive

pytestmark = pytest.mark.cluster

FAKE_NODES = [d for d in yaml.safe_load_all(tools.FAKE_NODES.read_text()) if d]
GPU_RESOURCES = {
    "nvidia.com/gpu": "8",
    "vpc.amazonaws.com/efa": "16",
    "hugepages-2Mi": "5120Mi",
    "cpu": "4",
    "memory": "16Gi",
}


def deployment(name: str, replicas: int, resources: dict | None = None, tolerations: list | None = None) -> dict:
    container = {"name": "main", "image": "registry.k8s.io/pause:3.10"}
    if resources:
        container["resources"] = {"requests": resources, "limits": resources}
    pod_spec: dict = {"containers": [container], "terminationGracePeriodSeconds": 0}
    if tolerations:
        pod_spec["tolerations"] = tolerations
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": pod_spec},
        },
    }


GPU_TOLERATION = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]


def pods(kubectl, namespace: str, app: str) -> list[dict]:
    return kubectl.json("-n", namespace, "get", "pods", "-l", f"app={app}")["items"]


def running(items: list[dict], count: int) -> list[dict] | None:
    ok = [p for p in items if p["status"].get("phase") == "Running" and p["status"].get("podIP")]
    return ok if len(items) == count and len(ok) == count else None


def nodes_by_name(kubectl) -> dict[str, dict]:
    return {n["metadata"]["name"]: n for n in kubectl.json("get", "nodes")["items"]}


def test_nodes_are_ready_with_the_fixture_allocatable(kubectl):
    live = nodes_by_name(kubectl)
    assert set(live) == {d["metadata"]["name"] for d in FAKE_NODES}
    for want in FAKE_NODES:
        node = live[want["metadata"]["name"]]
        ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
        assert ready and ready[0]["status"] == "True", node["metadata"]["name"]
        for resource, quantity in want["status"]["allocatable"].items():
            assert node["status"]["allocatable"][resource] == quantity, (node["metadata"]["name"], resource)
        assert node["metadata"]["labels"] == {**node["metadata"]["labels"], **want["metadata"]["labels"]}
        assert [(t["key"], t["effect"]) for t in node["spec"].get("taints", [])] == [
            (t["key"], t["effect"]) for t in want["spec"].get("taints", [])
        ]
    p5en = [n for n in live.values() if n["metadata"]["labels"]["node.kubernetes.io/instance-type"] == "p5en.48xlarge"]
    assert len(p5en) >= 2
    assert all(
        n["status"]["allocatable"]["nvidia.com/gpu"] == "8"
        and n["status"]["allocatable"]["vpc.amazonaws.com/efa"] == "16"
        for n in p5en
    )


def test_gpu_efa_pods_land_on_p5en_only_and_run(kubectl, namespace, wait_for):
    kubectl.apply(deployment("gpu", 2, GPU_RESOURCES, GPU_TOLERATION), namespace)
    items = wait_for(lambda: running(pods(kubectl, namespace, "gpu"), 2), timeout=90, what="2 GPU pods Running")
    live = nodes_by_name(kubectl)
    hosts = set()
    for pod in items:
        node = live[pod["spec"]["nodeName"]]
        assert node["metadata"]["labels"]["node.kubernetes.io/instance-type"] == "p5en.48xlarge"
        # kwok allocates the pod IP from the node's own podCIDR and reports the node's InternalIP as hostIP.
        assert ipaddress.ip_address(pod["status"]["podIP"]) in ipaddress.ip_network(node["spec"]["podCIDR"])
        assert pod["status"]["hostIP"] == next(
            a["address"] for a in node["status"]["addresses"] if a["type"] == "InternalIP"
        )
        hosts.add(node["metadata"]["name"])
    assert len(hosts) == 2, "8 GPUs each: two pods cannot share a p5en node"


def test_scheduler_counts_extended_resources(kubectl, namespace, wait_for):
    too_big = dict(GPU_RESOURCES, **{"nvidia.com/gpu": "9"})
    kubectl.apply(deployment("too-big", 1, too_big, GPU_TOLERATION), namespace)

    def unschedulable():
        items = pods(kubectl, namespace, "too-big")
        conds = [c for p in items for c in p["status"].get("conditions", []) if c["type"] == "PodScheduled"]
        return conds and conds[0]["status"] == "False" and "nvidia.com/gpu" in conds[0].get("message", "") and conds

    conds = wait_for(unschedulable, timeout=60, what="a FailedScheduling condition naming nvidia.com/gpu")
    assert conds[0]["reason"] == "Unschedulable"
    assert not pods(kubectl, namespace, "too-big")[0]["spec"].get("nodeName")


def test_untolerating_pods_never_land_on_accelerator_nodes(kubectl, namespace, wait_for):
    kubectl.apply(deployment("plain", 6, {"cpu": "100m", "memory": "64Mi"}), namespace)
    items = wait_for(lambda: running(pods(kubectl, namespace, "plain"), 6), timeout=90, what="6 plain pods Running")
    live = nodes_by_name(kubectl)
    types = {live[p["spec"]["nodeName"]]["metadata"]["labels"]["node.kubernetes.io/instance-type"] for p in items}
    assert types == {"m7i.4xlarge"}


def test_deleting_a_deployment_garbage_collects_its_pods(kubectl, namespace, wait_for):
    kubectl.apply(deployment("gc", 3, {"cpu": "100m", "memory": "64Mi"}), namespace)
    wait_for(lambda: running(pods(kubectl, namespace, "gc"), 3), timeout=90, what="3 pods Running")
    assert kubectl.json("-n", namespace, "get", "replicasets")["items"], "the deployment controller made no RS"
    kubectl("-n", namespace, "delete", "deployment", "gc", "--wait=false")
    wait_for(
        lambda: not pods(kubectl, namespace, "gc") and not kubectl.json("-n", namespace, "get", "rs")["items"],
        timeout=90,
        what="ReplicaSet and pods garbage-collected",
    )


def audit_events(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_audit_log_records_write_requests(cluster, kubectl, namespace):
    kubectl("-n", namespace, "create", "configmap", "audit-probe", "--from-literal=a=1")
    kubectl("-n", namespace, "patch", "configmap", "audit-probe", "--type=merge", "-p", '{"data":{"a":"2"}}')
    kubectl("-n", namespace, "delete", "configmap", "audit-probe")
    mine = [
        e
        for e in audit_events(cluster.audit_log_path)
        if e.get("objectRef", {}).get("namespace") == namespace
        and e["objectRef"].get("resource") == "configmaps"
        and e["objectRef"].get("name") in ("audit-probe", None)
        and e["verb"] in ("create", "update", "patch", "delete")
    ]
    assert [e["verb"] for e in mine] == ["create", "patch", "delete"]
    assert all(e["level"] == "Metadata" and e["stage"] == "ResponseComplete" for e in mine)
    assert {e["user"]["username"] for e in mine} == {"duplex-admin"}
    assert [e["responseStatus"]["code"] for e in mine] == [201, 200, 200]


def test_client_cert_users_are_subject_to_rbac(cluster, kubectl, namespace, wait_for):
    viewer = kubectl.as_kubeconfig(cluster.kubeconfig_for_user("alice", ["duplex:testers"], namespace=namespace))
    with pytest.raises(AssertionError, match=r"Forbidden|forbidden"):
        viewer("get", "pods")
    kubectl("-n", namespace, "create", "rolebinding", "alice-view", "--clusterrole=view", "--user=alice")

    def can_list() -> bool:
        try:
            viewer("get", "pods")
        except AssertionError:
            return False
        return True

    wait_for(can_list, timeout=30, what="alice can list pods once bound to view")
    with pytest.raises(AssertionError, match="forbidden"):
        viewer("create", "configmap", "nope")
    who = json.loads(viewer("auth", "whoami", "-o", "json"))
    assert who["status"]["userInfo"]["username"] == "alice"
    assert "duplex:testers" in who["status"]["userInfo"]["groups"]


def test_serviceaccount_tokens_work(cluster, kubectl, namespace):
    kubectl("-n", namespace, "create", "serviceaccount", "robot")
    robot = kubectl.as_kubeconfig(cluster.kubeconfig_for_serviceaccount(namespace, "robot"))
    who = json.loads(robot("auth", "whoami", "-o", "json"))
    assert who["status"]["userInfo"]["username"] == f"system:serviceaccount:{namespace}:robot"
    with pytest.raises(AssertionError, match="forbidden"):
        robot("get", "pods")


def test_cli_status_and_idempotent_up(cluster, capsys):
    assert cluster_cli(["status", "--dir", str(cluster.state_dir)]) == 0
    out = capsys.readouterr().out
    assert "running" in out and "p5en.48xlarge" in out
    assert cluster_cli(["up", "--dir", str(cluster.state_dir), "--no-build"]) == 0
    captured = capsys.readouterr()
    assert "already running" in captured.err
    assert captured.out.strip() == str(cluster.kubeconfig)
    assert cluster_cli(["kubeconfig", "--dir", str(cluster.state_dir)]) == 0
    assert capsys.readouterr().out.strip() == str(cluster.kubeconfig)


def test_restart_apiserver_keeps_data_and_controllers_reconnect(cluster, kubectl, namespace, wait_for):
    kubectl("-n", namespace, "create", "configmap", "survivor", "--from-literal=k=v")
    state = json.loads((cluster.state_dir / "state.json").read_text())
    old = ProcessRecord.from_json(state["processes"]["kube-apiserver"])
    port = state["ports"]["apiserver"]

    cluster.restart_apiserver()

    state = json.loads((cluster.state_dir / "state.json").read_text())
    new = ProcessRecord.from_json(state["processes"]["kube-apiserver"])
    assert new.pid != old.pid and not is_alive(old) and is_alive(new)
    assert state["ports"]["apiserver"] == port
    assert kubectl.json("-n", namespace, "get", "configmap", "survivor")["data"] == {"k": "v"}
    # The controller-manager, scheduler and kwok reconnect on their own: a new Deployment still ends up Running.
    kubectl.apply(deployment("after-restart", 1, {"cpu": "100m", "memory": "64Mi"}), namespace)
    wait_for(
        lambda: running(pods(kubectl, namespace, "after-restart"), 1),
        timeout=120,
        what="a pod Running after the apiserver restart",
    )
    assert cluster.is_running()

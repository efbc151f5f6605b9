"""The end of the tier (this file runs after the others): what a user removes goes, and `duplex-dev cluster down`
leaves nothing of either real node on the machine."""

from __future__ import annotations

import subprocess
from pathlib import Path

from conftest import NAMESPACE, RELEASE, RELEASE_NAMESPACE, SERVING, Cluster, wait_for

from duplex_dev import processes
from duplex_dev.cluster.node import mounts_under


def names(cluster: Cluster, kind: str, namespace: str, selector: str) -> list[str]:
    items = cluster.json("-n", namespace, "get", kind, "-l", selector)["items"]
    return [i["metadata"]["name"] for i in items]


def test_deleting_the_serving_and_uninstalling_the_chart_leave_nothing_running(serving: Cluster) -> None:
    selector = f"duplex.dev/serving={SERVING}"
    assert names(serving, "pods", NAMESPACE, selector)
    serving.kubectl("-n", NAMESPACE, "delete", "dsv", SERVING, "--wait=true", timeout=180)
    for kind in ("deployments", "services", "configmaps", "pods"):
        wait_for(lambda k=kind: not names(serving, k, NAMESPACE, selector), 180, f"{kind} of the serving gone")
    serving.helm("uninstall", RELEASE, "-n", RELEASE_NAMESPACE, "--wait", "--timeout", "3m")
    operator = "app.kubernetes.io/name=duplex"
    wait_for(lambda: not names(serving, "pods", RELEASE_NAMESPACE, operator), 180, "the operator pod gone")
    assert not names(serving, "clusterroles", "default", operator)
    # The CRD stays (helm.sh/resource-policy: keep): deleting it would delete every serving of the cluster.
    assert serving.kubectl("get", "crd", "disaggregatedservings.duplex.dev", "-o", "name").strip()


def test_cluster_down_leaves_no_process_mount_namespace_link_route_rule_or_cgroup(node_cluster: Cluster) -> None:
    nodes = node_cluster.local.nodes
    assert [node.name for node in nodes] == ["duplex-node", "duplex-node-b"]
    records = node_cluster.local.process_records()
    assert {f"{node.name}/kubelet" for node in nodes[1:]} <= set(records)  # every node's daemons were recorded
    state_dir = node_cluster.local.state_dir
    node_cluster.local.down()
    for node in nodes:
        assert node.leftovers() == [], node.name
    assert mounts_under(Path(state_dir)) == []
    alive = [f"{name} (pid {record.pid})" for name, record in records.items() if processes.is_alive(record)]
    assert alive == [], alive
    host_rules = subprocess.run(["iptables-save"], capture_output=True, text=True).stdout
    assert "KUBE-" not in host_rules
    assert all(node.addrs.pod_cidr not in host_rules for node in nodes)
    routes = subprocess.run(["ip", "route", "show"], capture_output=True, text=True).stdout
    assert all(node.addrs.link_cidr not in routes and node.addrs.pod_cidr not in routes for node in nodes), routes

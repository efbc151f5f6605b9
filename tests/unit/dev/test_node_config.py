"""The local cluster's real node, as configuration: every address from 198.18.0.0/15, slots that never overlap, and
daemons that write nothing outside the node's own directory."""

from __future__ import annotations

import ipaddress
import json
import tomllib
from itertools import combinations
from pathlib import Path

import pytest
import yaml

from duplex_dev.cluster.addresses import (
    KWOK_POD_CIDR,
    NODELESS_SERVICE_CIDR,
    SLOTS,
    TEST_RANGE,
    NodeAddresses,
)
from duplex_dev.cluster.components import Layout
from duplex_dev.cluster.node_config import (
    NODE_NAME,
    NodeLayout,
    cni_conflist,
    containerd_toml,
    kube_proxy_yaml,
    kubelet_argv,
    kubelet_yaml,
    node_name,
)

ROOT = Path(__file__).resolve().parents[3]
RANGE = ipaddress.ip_network(TEST_RANGE)


def networks(addrs: NodeAddresses) -> list[ipaddress.IPv4Network]:
    link = ipaddress.ip_network(f"{addrs.host}/{addrs.link_prefix}", strict=False)
    return [ipaddress.ip_network(addrs.pod_cidr), ipaddress.ip_network(addrs.service_cidr), link]


def test_every_address_is_in_the_benchmark_range_and_no_two_uses_overlap() -> None:
    nets = [net for slot in range(SLOTS) for net in networks(NodeAddresses(slot))]
    nets += [ipaddress.ip_network(NODELESS_SERVICE_CIDR), ipaddress.ip_network(KWOK_POD_CIDR)]
    assert all(net.subnet_of(RANGE) for net in nets)
    for a, b in combinations(nets, 2):
        assert not a.overlaps(b), (a, b)


def test_the_fake_fleet_s_addresses_are_in_the_range_too() -> None:
    docs = [d for d in yaml.safe_load_all((ROOT / "tests/fixtures/fake-nodes.yaml").read_text()) if d]
    for node in docs:
        assert ipaddress.ip_network(node["spec"]["podCIDR"]).subnet_of(ipaddress.ip_network(KWOK_POD_CIDR))
        for address in node["status"]["addresses"]:
            if address["type"] == "InternalIP":
                assert ipaddress.ip_address(address["address"]) in RANGE


def test_a_slot_outside_the_range_is_refused() -> None:
    with pytest.raises(ValueError):
        NodeAddresses(SLOTS)


def _paths(value: object) -> list[str]:
    if isinstance(value, dict):
        return [p for v in value.values() for p in _paths(v)]
    if isinstance(value, list):
        return [p for v in value for p in _paths(v)]
    return [value] if isinstance(value, str) and value.startswith("/") else []


def test_containerd_keeps_its_state_sockets_and_pod_namespaces_under_the_node_dir(tmp_path: Path) -> None:
    layout = NodeLayout(tmp_path / "node")
    cfg = tomllib.loads(containerd_toml(layout))
    runtime = cfg["plugins"]["io.containerd.cri.v1.runtime"]
    assert runtime["netns_mounts_under_state_dir"] is True
    assert runtime["restrict_oom_score_adj"] is True  # no CAP_SYS_RESOURCE here
    assert runtime["containerd"]["runtimes"]["runc"]["options"]["SystemdCgroup"] is False
    written = [cfg["root"], cfg["state"], cfg["grpc"]["address"], runtime["cni"]["conf_dir"]]
    assert all(Path(p).is_relative_to(layout.root) for p in written)
    assert "io.containerd.internal.v1.opt" in cfg["disabled_plugins"]  # would create /opt/containerd


def test_pods_get_a_route_to_the_test_range_only(tmp_path: Path) -> None:
    addrs = NodeAddresses(3)
    doc = json.loads(cni_conflist(NodeLayout(tmp_path), addrs))
    (bridge,) = doc["plugins"]
    assert bridge["ipMasq"] is False
    assert bridge["ipam"]["routes"] == [{"dst": TEST_RANGE}]
    assert bridge["ipam"]["ranges"] == [[{"subnet": "198.18.3.0/24", "gateway": "198.18.3.1"}]]
    assert Path(bridge["ipam"]["dataDir"]).is_relative_to(tmp_path)


def test_the_kubelet_runs_on_cgroups_v1_in_the_node_s_cgroup_and_writes_under_the_node_dir(tmp_path: Path) -> None:
    layout, addrs = NodeLayout(tmp_path), NodeAddresses(1)
    cfg = yaml.safe_load(kubelet_yaml(layout, addrs, tmp_path / "ca.crt", addrs.cgroup_root))
    assert cfg["failCgroupV1"] is False and cfg["cgroupDriver"] == "cgroupfs"
    assert cfg["cgroupRoot"] == "/duplex-node-1"
    assert cfg["address"] == cfg["healthzBindAddress"] == addrs.node
    assert cfg["authentication"]["anonymous"]["enabled"] is False and cfg["readOnlyPort"] == 0
    kept = {addrs.cgroup_root, str(layout.pod_logs)}  # the pods' logs outlive the node, beside the cluster's logs
    assert all(Path(p).is_relative_to(tmp_path) for p in _paths(cfg) if p not in kept)
    assert layout.pod_logs == tmp_path.parent / "logs" / "pods"


def test_kube_proxy_leaves_the_host_s_conntrack_settings_alone(tmp_path: Path) -> None:
    cfg = yaml.safe_load(kube_proxy_yaml(NodeLayout(tmp_path), NodeAddresses(0)))
    assert cfg["conntrack"]["maxPerCore"] == 0 and cfg["conntrack"]["min"] == 0
    assert cfg["clusterCIDR"] == "198.18.0.0/24"


def test_a_second_node_shares_no_name_dir_log_dir_or_address_with_the_first(tmp_path: Path) -> None:
    """Two real nodes of one cluster (`real_nodes=2`): the first keeps what one node had; the second has its own
    name, files, pods' logs (a kubelet removes the log dirs of pods it does not know) and slot."""
    assert [node_name(i) for i in range(3)] == [NODE_NAME, "duplex-node-b", "duplex-node-c"]
    state = Layout(tmp_path)
    first = NodeLayout(state.node_dir_of(NODE_NAME), NODE_NAME)
    second = NodeLayout(state.node_dir_of("duplex-node-b"), "duplex-node-b")
    assert first.root == state.node_dir and first.pod_logs == tmp_path / "logs" / "pods"
    assert second.root != first.root and second.pod_logs != first.pod_logs
    assert not second.pod_logs.is_relative_to(first.pod_logs)
    for layout, addrs in ((first, NodeAddresses(0)), (second, NodeAddresses(1))):
        assert f"--hostname-override={layout.name}" in kubelet_argv(Path("kubelet"), layout, addrs)
        assert yaml.safe_load(kube_proxy_yaml(layout, addrs))["hostnameOverride"] == layout.name
    a, b = (ipaddress.ip_network(NodeAddresses(slot).link_cidr) for slot in (0, 1))
    assert not a.overlaps(b) and ipaddress.ip_address(NodeAddresses(1).host) in b

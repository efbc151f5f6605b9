"""The real node's network: a network namespace of its own, joined to the host by one veth pair, with host routes to
its pods and Services only (addresses.py). The node's bridge, pods, iptables rules and conntrack entries all live in
that namespace, so deleting it removes them; there is no default route in it, so no packet leaves for elsewhere.

The nodes of one cluster reach each other through the host (`join`): each namespace routes the other nodes' pod
ranges and links to its host end, and the host forwards between the cluster's links only (forwarding is switched on
per link, not machine-wide: `net.ipv4.ip_forward` stays as found, and the setting goes with the link)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from duplex_dev.cluster.addresses import SLOTS, NodeAddresses


class NetworkError(RuntimeError):
    pass


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        raise NetworkError(f"ip {' '.join(args)}: {proc.stderr.strip()}")
    return proc


def link_exists(name: str) -> bool:
    return Path(f"/sys/class/net/{name}").exists()


def netns_exists(name: str) -> bool:
    return Path(f"/run/netns/{name}").exists()


def claim_slot() -> NodeAddresses:
    """The first free slot, claimed by creating its namespace: `ip netns add` fails when another cluster has it."""
    for slot in range(SLOTS):
        addrs = NodeAddresses(slot)
        if netns_exists(addrs.netns) or link_exists(addrs.host_link):
            continue
        if _ip("netns", "add", addrs.netns, check=False).returncode == 0:
            return addrs
    raise NetworkError(f"all {SLOTS} node slots are taken (ip netns list shows duplex-node-*): stop a cluster")


def wire(addrs: NodeAddresses, services: bool = True) -> None:
    """The veth pair, both ends' addresses, and the host's routes into the node: its pods, and the cluster's Services
    when `services` (the cluster's first node; its kube-proxy answers them for the host)."""
    ns = addrs.netns
    _ip("link", "add", addrs.host_link, "type", "veth", "peer", "name", "eth0", "netns", ns)
    _ip("addr", "add", f"{addrs.host}/{addrs.link_prefix}", "dev", addrs.host_link)
    _ip("link", "set", addrs.host_link, "up")
    _ip("-n", ns, "link", "set", "lo", "up")
    _ip("-n", ns, "addr", "add", f"{addrs.node}/{addrs.link_prefix}", "dev", "eth0")
    _ip("-n", ns, "link", "set", "eth0", "up")
    for cidr in (addrs.pod_cidr, addrs.service_cidr) if services else (addrs.pod_cidr,):
        _ip("route", "add", cidr, "via", addrs.node, "dev", addrs.host_link)
    # Forwarding between the bridge and eth0, and iptables on bridged traffic (a pod reaching a Service whose
    # endpoint is on the same bridge): both settings belong to the namespace, not the host.
    for key, value in (("net.ipv4.ip_forward", "1"), ("net.bridge.bridge-nf-call-iptables", "1")):
        proc = subprocess.run(
            ["nsenter", f"--net=/run/netns/{ns}", "sysctl", "-qw", f"{key}={value}"], capture_output=True, text=True
        )
        if proc.returncode != 0:
            raise NetworkError(f"sysctl {key}={value} in {ns}: {proc.stderr.strip()}")


def join(nodes: list[NodeAddresses]) -> None:
    """Routes between the nodes of one cluster, through the host: in each node's namespace, every other node's pod
    range and link (the host end of the first node's link is where the apiserver listens) via its own host end; on
    the host, forwarding on these links only. Packets a node sends elsewhere still find no route."""
    if len(nodes) < 2:
        return
    for addrs in nodes:
        for other in nodes:
            if other != addrs:
                for cidr in (other.pod_cidr, other.link_cidr):
                    _ip("-n", addrs.netns, "route", "add", cidr, "via", addrs.host, "dev", "eth0")
        key = f"net.ipv4.conf.{addrs.host_link}.forwarding"
        proc = subprocess.run(["sysctl", "-qw", f"{key}=1"], capture_output=True, text=True)
        if proc.returncode != 0:
            raise NetworkError(f"sysctl {key}=1: {proc.stderr.strip()}")


def unwire(addrs: NodeAddresses) -> None:
    """Delete the namespace (its end of the veth, the bridge, pods' veths and its iptables rules go with it); the
    host's veth end and its routes go with its peer. Nothing there is not an error."""
    if netns_exists(addrs.netns):
        _ip("netns", "del", addrs.netns, check=False)
    if link_exists(addrs.host_link):
        _ip("link", "del", addrs.host_link, check=False)


def leftovers(addrs: NodeAddresses) -> list[str]:
    """What of the node's network is still there (empty after `unwire`)."""
    found = []
    if netns_exists(addrs.netns):
        found.append(f"network namespace {addrs.netns}")
    if link_exists(addrs.host_link):
        found.append(f"link {addrs.host_link}")
    routes = _ip("route", "show", check=False).stdout
    for cidr in (addrs.pod_cidr, addrs.service_cidr):
        if any(line.startswith(cidr + " ") for line in routes.splitlines()):
            found.append(f"route {cidr}")
    return found

"""Every address the local cluster gives out, from 198.18.0.0/15 only (RFC 2544, benchmark testing): nothing it
creates can be confused with, or route to, a real network.

    198.18.<slot>.0/24        pods of the real node of slot 0..14 (gateway .1 on the node's bridge)
    198.18.255.<4*slot>/30    the link between the host (.+1) and the node's network namespace (.+2)
    198.19.<8*slot>.0/21      Services of a cluster whose first real node is in that slot
    198.19.120.0/21           Services of a cluster without a real node (no route leads there)
    198.19.128.0/18           pod addresses kwok makes up for the fake nodes (never carry a packet)
    198.19.255.0/24           the fake nodes' InternalIPs (tests/fixtures/fake-nodes.yaml)

A slot is one real node's: its network namespace, link, pod range and cgroup. A slot lets a second cluster with a real
node (the tests' beside a developer's `make run`) run at the same time, and a cluster with two real nodes (the e2e
tier's, for a node drain) takes two slots, the first free ones, as two clusters would: the nodes then share nothing
that `down` could tear from the wrong owner, and the addresses of a node never depend on which cluster it is in. The
cluster's Services come from its first node's slot (the host routes them into that node, whose kube-proxy answers
them as any node's would); the other nodes' Service ranges stay unused. 15 slots are then 15 one-node clusters, or
fewer with more nodes: far more than 2 cores run at once."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

SLOTS = 15
NODELESS_SERVICE_CIDR = "198.19.120.0/21"
KWOK_POD_CIDR = "198.19.128.0/18"
TEST_RANGE = "198.18.0.0/15"


@dataclass(frozen=True)
class NodeAddresses:
    """The addresses of the real node in one slot."""

    slot: int

    def __post_init__(self) -> None:
        if not 0 <= self.slot < SLOTS:
            raise ValueError(f"slot {self.slot} is outside 0..{SLOTS - 1}")

    @property
    def host(self) -> str:
        """The host's end of the link: the apiserver listens here so that pods reach it."""
        return f"198.18.255.{4 * self.slot + 1}"

    @property
    def node(self) -> str:
        """The node's end of the link: its InternalIP, where the kubelet serves."""
        return f"198.18.255.{4 * self.slot + 2}"

    @property
    def link_prefix(self) -> int:
        return 30

    @property
    def link_cidr(self) -> str:
        """Both ends of the link: another node of the cluster routes it through the host."""
        return f"198.18.255.{4 * self.slot}/{self.link_prefix}"

    @property
    def pod_cidr(self) -> str:
        return f"198.18.{self.slot}.0/24"

    @property
    def pod_gateway(self) -> str:
        return f"198.18.{self.slot}.1"

    @property
    def service_cidr(self) -> str:
        return f"198.19.{8 * self.slot}.0/21"

    @property
    def kubernetes_service_ip(self) -> str:
        """The first Service address, which the apiserver gives the `kubernetes` Service."""
        return str(ipaddress.ip_network(self.service_cidr)[1])

    @property
    def dns_service_ip(self) -> str:
        return str(ipaddress.ip_network(self.service_cidr)[10])

    @property
    def host_link(self) -> str:
        """The host's veth; its peer in the node's namespace is eth0."""
        return f"dpx{self.slot}"

    @property
    def netns(self) -> str:
        return f"duplex-node-{self.slot}"

    @property
    def cgroup_root(self) -> str:
        """The node's cgroup, in every hierarchy: its daemons and every pod live under it."""
        return f"/duplex-node-{self.slot}"


def nodeless_kubernetes_service_ip() -> str:
    return str(ipaddress.ip_network(NODELESS_SERVICE_CIDR)[1])

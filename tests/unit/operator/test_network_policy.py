"""NetworkPolicies: engines' HTTP port only from this serving's router (and the metrics namespaces), the NIXL side
channel and transport only from the other engine role of this serving, the router open on its port."""

from __future__ import annotations

from typing import Any

import pytest
from dsv_helpers import children, find, spec

from duplex.children.labels import ROLE_LABEL, SERVING_LABEL
from duplex.children.network_policy import engine_policy, network_policies, router_policy
from duplex.render import InvalidSpec

ROLES = ("prefill", "decode")
OTHER = {"prefill": "decode", "decode": "prefill"}


def pods(serving: str, role: str) -> dict[str, Any]:
    return {"podSelector": {"matchLabels": {SERVING_LABEL: serving, ROLE_LABEL: role}}}


@pytest.mark.parametrize("role", ROLES)
def test_an_engine_takes_http_from_its_router_and_scrapers_and_nixl_from_its_peer_role(role: str) -> None:
    policy = engine_policy(spec({"kvTransfer": {"sideChannelPort": 5700}}), "qwen", "inference", role)
    assert (policy["apiVersion"], policy["kind"]) == ("networking.k8s.io/v1", "NetworkPolicy")
    assert policy["metadata"]["name"] == f"qwen-{role}" and policy["metadata"]["namespace"] == "inference"
    body = policy["spec"]
    assert body["podSelector"] == pods("qwen", role)["podSelector"]  # exactly this role's pods of this serving
    assert body["policyTypes"] == ["Ingress"]  # engines still reach the hub; the router the API server
    http = [{"protocol": "TCP", "port": 8000}]
    monitoring = {
        "matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["monitoring"]}]
    }
    assert body["ingress"] == [
        {"from": [pods("qwen", "router")], "ports": http},
        {"from": [{"namespaceSelector": monitoring}], "ports": http},
        {
            "from": [pods("qwen", OTHER[role])],
            "ports": [
                {"protocol": "TCP", "port": 5700},  # the side channel
                {"protocol": "TCP", "port": 1024, "endPort": 7999},  # UCX's listeners: every port but HTTP
                {"protocol": "TCP", "port": 8001, "endPort": 65535},
            ],
        },
    ]


def test_no_peer_but_the_router_and_the_other_role_reaches_http_or_nixl() -> None:
    """The peer role's rule never opens the HTTP port, and nothing is open to a bare `from` (everyone)."""
    for role in ROLES:
        for rule in engine_policy(spec(), "qwen", "ns", role)["spec"]["ingress"]:
            assert rule.get("from"), rule
            for port in rule["ports"]:
                covers_http = port["port"] <= 8000 <= port.get("endPort", port["port"])
                assert covers_http == (rule["from"] != [pods("qwen", OTHER[role])]), (role, rule)


def test_metrics_namespaces_are_configurable_and_can_be_none() -> None:
    many = engine_policy(
        spec({"network": {"networkPolicy": {"metricsNamespaces": ["obs", "prom"]}}}), "q", "n", "decode"
    )
    (scrapers,) = [r for r in many["spec"]["ingress"] if "namespaceSelector" in r["from"][0]]
    assert scrapers["from"][0]["namespaceSelector"]["matchExpressions"][0]["values"] == ["obs", "prom"]
    none = engine_policy(spec({"network": {"networkPolicy": {"metricsNamespaces": []}}}), "q", "n", "decode")
    assert [r["from"] for r in none["spec"]["ingress"]] == [[pods("q", "router")], [pods("q", "prefill")]]


def test_metrics_namespaces_must_be_namespace_names() -> None:
    with pytest.raises(InvalidSpec, match=r"spec\.network\.networkPolicy\.metricsNamespaces\[0\]"):
        spec({"network": {"networkPolicy": {"metricsNamespaces": ["Not_A_Namespace"]}}})


def test_the_router_is_open_on_its_api_port_to_everyone_and_on_its_admin_port_to_scrapers_and_its_decode() -> None:
    policy = router_policy(spec(), "qwen", "inference")
    monitoring = {
        "matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["monitoring"]}]
    }
    assert policy["spec"] == {
        "podSelector": pods("qwen", "router")["podSelector"],
        "policyTypes": ["Ingress"],
        "ingress": [
            {"ports": [{"protocol": "TCP", "port": 8000}]},
            # decode pods' preStop hook asks the admin port what they still hold (/drain, with the engine key)
            {"from": [pods("qwen", "decode")], "ports": [{"protocol": "TCP", "port": 9090}]},
            {"from": [{"namespaceSelector": monitoring}], "ports": [{"protocol": "TCP", "port": 9090}]},
        ],
    }
    alone = router_policy(spec({"network": {"networkPolicy": {"metricsNamespaces": []}}}), "qwen", "inference")
    assert alone["spec"]["ingress"] == policy["spec"]["ingress"][:2]


def test_policies_select_the_pods_the_deployments_run() -> None:
    objs = children()
    for name in ("demo-prefill", "demo-decode", "demo-router"):
        labels = find(objs, "Deployment", name)["spec"]["template"]["metadata"]["labels"]
        selector = find(objs, "NetworkPolicy", name)["spec"]["podSelector"]["matchLabels"]
        assert selector.items() <= labels.items()


def test_a_switch_turns_them_off() -> None:
    assert network_policies(spec({"network": {"networkPolicy": {"enabled": False}}}), "q", "n") == []
    assert not [o for o in children({"network": {"networkPolicy": {"enabled": False}}}) if o["kind"] == "NetworkPolicy"]

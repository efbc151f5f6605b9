"""Services: headless per-role Services whose EndpointSlices feed the router, and the router's own Service; each
selects exactly the pods of its Deployment and targets ports those pods name."""

from __future__ import annotations

import pytest
from dsv_helpers import children, container, find, spec

from duplex.children.labels import ROLE_LABEL, SERVING_LABEL
from duplex.children.services import drain_service, engine_service, router_endpoint, router_service

ROLES = ("prefill", "decode")


@pytest.mark.parametrize("role", ROLES)
def test_engine_service_is_headless_and_selects_its_role(role: str) -> None:
    svc = engine_service(spec({"kvTransfer": {"sideChannelPort": 5700}}), "qwen", "inference", role)
    assert (svc["apiVersion"], svc["kind"]) == ("v1", "Service")
    assert svc["metadata"]["name"] == f"qwen-{role}" and svc["metadata"]["namespace"] == "inference"
    assert svc["metadata"]["labels"][ROLE_LABEL] == role
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["selector"] == {SERVING_LABEL: "qwen", ROLE_LABEL: role}
    # only ready engines are published: the router must never route to a loading engine
    assert svc["spec"].get("publishNotReadyAddresses", False) is False
    assert svc["spec"]["ports"] == [
        {"name": "http", "port": 8000, "targetPort": "http", "protocol": "TCP"},
        {"name": "nixl-side", "port": 5700, "targetPort": "nixl-side", "protocol": "TCP"},
    ]


def test_router_service_defaults() -> None:
    svc = router_service(spec(), "qwen", "inference")
    assert svc["metadata"]["name"] == "qwen-router"
    assert "annotations" not in svc["metadata"]
    assert svc["spec"] == {
        "type": "ClusterIP",
        "selector": {SERVING_LABEL: "qwen", ROLE_LABEL: "router"},
        "ports": [{"name": "http", "port": 8000, "targetPort": "http", "protocol": "TCP"}],
    }


def test_router_service_type_port_annotations() -> None:
    annotations = {"service.beta.kubernetes.io/aws-load-balancer-type": "external"}
    svc = router_service(
        spec({"router": {"service": {"type": "LoadBalancer", "port": 80, "annotations": annotations}}}), "qwen", "ns1"
    )
    assert svc["spec"]["type"] == "LoadBalancer"
    assert svc["spec"]["ports"][0]["port"] == 80 and svc["spec"]["ports"][0]["targetPort"] == "http"
    assert svc["metadata"]["annotations"] == annotations


def test_router_endpoint_url() -> None:
    assert router_endpoint(spec(), "qwen", "inference") == "http://qwen-router.inference.svc:8000"
    assert router_endpoint(spec({"router": {"service": {"port": 80}}}), "q", "ns") == "http://q-router.ns.svc:80"


@pytest.mark.parametrize("workload", ["prefill", "decode", "router"])
def test_each_service_selects_exactly_its_deployments_pods(workload: str) -> None:
    objs = children(name="qwen")
    svc = find(objs, "Service", f"qwen-{workload}")
    deployments = [o for o in objs if o["kind"] == "Deployment"]
    selected = [
        d["metadata"]["name"]
        for d in deployments
        if svc["spec"]["selector"].items() <= d["spec"]["template"]["metadata"]["labels"].items()
    ]
    assert selected == [f"qwen-{workload}"]
    port_names = {p["name"] for p in container(find(objs, "Deployment", f"qwen-{workload}"))["ports"]}
    assert {p["targetPort"] for p in svc["spec"]["ports"]} <= port_names


def test_services_of_two_servings_do_not_select_each_others_pods() -> None:
    a, b = children(name="alpha"), children(name="beta")
    svc = find(a, "Service", "alpha-prefill")
    for d in (o for o in b if o["kind"] == "Deployment"):
        assert not svc["spec"]["selector"].items() <= d["spec"]["template"]["metadata"]["labels"].items()


def test_the_drain_service_reaches_only_the_routers_admin_port_inside_the_cluster() -> None:
    svc = drain_service("qwen", "inference")
    assert svc["metadata"]["name"] == "qwen-drain"
    assert svc["spec"] == {
        "type": "ClusterIP",  # never the router Service's type, which may be a LoadBalancer
        "selector": {SERVING_LABEL: "qwen", ROLE_LABEL: "router"},
        "ports": [{"name": "admin", "port": 9090, "targetPort": "admin", "protocol": "TCP"}],
    }
    router_pod = container(find(children(spec()), "Deployment", "demo-router"))
    assert {"name": "admin", "containerPort": 9090, "protocol": "TCP"} in router_pod["ports"]

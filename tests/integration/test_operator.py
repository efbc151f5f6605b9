"""The operator against the real control plane: children, scheduling on fake EFA nodes, status, drift, rolls,
garbage collection, crash/restart convergence, API server restarts, zero-write resyncs, and RBAC."""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from operator_harness import (
    OPERATOR_USER,
    ROOT,
    OperatorProcess,
    install_crd_and_rbac,
    operator_writes,
    wait_seconds,
)

pytestmark = pytest.mark.cluster

SEED = yaml.safe_load((ROOT / "examples/seed.yaml").read_text())
CHILD_KINDS = ("serviceaccount", "role", "rolebinding", "configmap", "service", "deployment")


@pytest.fixture(scope="module")
def operator(cluster: Any, kubectl: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    install_crd_and_rbac(kubectl)
    kubeconfig = cluster.kubeconfig_for_user(OPERATOR_USER)
    proc = OperatorProcess(kubeconfig, tmp_path_factory.mktemp("operator"))
    proc.start()
    yield proc
    proc.stop()


@pytest.fixture
def op(operator: OperatorProcess) -> Iterator[OperatorProcess]:
    """The operator, restarted if a previous test killed it. Its log tail goes to teardown output, which pytest
    shows for failed tests."""
    if not operator.alive():
        operator.start()
    yield operator
    print(f"----- operator log tail ({operator.log_path}) -----\n{operator.log_tail()}")


def seed(namespace: str, **spec_overrides: Any) -> dict[str, Any]:
    doc = copy.deepcopy(SEED)
    doc["metadata"]["namespace"] = namespace
    for path, value in spec_overrides.items():
        node = doc["spec"]
        parts = path.split("__")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    return doc


def get_dsv(kubectl: Any, namespace: str, name: str = "qwen3-32b") -> dict[str, Any]:
    return kubectl.json("-n", namespace, "get", "disaggregatedserving", name)


def condition(obj: dict[str, Any], ctype: str) -> dict[str, Any] | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c["type"] == ctype:
            return c
    return None


def is_ready(kubectl: Any, namespace: str) -> bool:
    obj = get_dsv(kubectl, namespace)
    c = condition(obj, "Ready")
    return bool(
        c and c["status"] == "True" and obj["status"].get("observedGeneration") == obj["metadata"]["generation"]
    )


def pods(kubectl: Any, namespace: str, role: str) -> list[dict[str, Any]]:
    return kubectl.json("-n", namespace, "get", "pods", "-l", f"duplex.dev/role={role}")["items"]


def node_types(kubectl: Any) -> dict[str, str]:
    nodes = kubectl.json("get", "nodes")["items"]
    return {n["metadata"]["name"]: n["metadata"]["labels"].get("node.kubernetes.io/instance-type", "") for n in nodes}


def children(kubectl: Any, namespace: str) -> dict[str, list[str]]:
    out = {}
    for kind in CHILD_KINDS:
        items = kubectl.json("-n", namespace, "get", kind, "-l", "duplex.dev/serving=qwen3-32b")["items"]
        out[kind] = sorted(i["metadata"]["name"] for i in items)
    return out


EXPECTED_CHILDREN = {
    "serviceaccount": ["qwen3-32b-router"],
    "role": ["qwen3-32b-router"],
    "rolebinding": ["qwen3-32b-router"],
    "configmap": ["qwen3-32b-router"],
    "service": ["qwen3-32b-decode", "qwen3-32b-prefill", "qwen3-32b-router"],
    "deployment": ["qwen3-32b-decode", "qwen3-32b-prefill", "qwen3-32b-router"],
}


def kv_config(deploy: dict[str, Any]) -> dict[str, Any]:
    args = deploy["spec"]["template"]["spec"]["containers"][0]["args"]
    return json.loads(args[args.index("--kv-transfer-config") + 1])


def test_seed_example_becomes_ready_on_fake_efa_nodes(op, kubectl, namespace, wait_for):
    kubectl.apply(seed(namespace))
    wait_for(lambda: is_ready(kubectl, namespace), timeout=120, what="Ready=True")
    assert children(kubectl, namespace) == EXPECTED_CHILDREN

    dsv = get_dsv(kubectl, namespace)
    st = dsv["status"]
    assert st["prefill"]["summary"] == "1/1" and st["decode"]["summary"] == "1/1"
    assert st["effectiveKV"]["backend"] == "LIBFABRIC"
    assert st["effectiveKV"]["decodeBlocksTTL"] == 480 and st["effectiveKV"]["recomputeThreshold"] == 64
    assert st["routerEndpoint"] == f"http://qwen3-32b-router.{namespace}.svc:8000"
    for ctype in ("ConfigValid", "PrefillReady", "DecodeReady", "RouterReady"):
        assert condition(dsv, ctype)["status"] == "True", ctype

    types = node_types(kubectl)
    for role in ("prefill", "decode"):
        (pod,) = pods(kubectl, namespace, role)
        assert pod["status"]["phase"] == "Running"
        assert types[pod["spec"]["nodeName"]] == "p5en.48xlarge"
        assert pod["status"].get("podIP")
        owner = pod["metadata"]["ownerReferences"][0]
        assert owner["kind"] == "ReplicaSet"
    (router_pod,) = pods(kubectl, namespace, "router")
    assert types[router_pod["spec"]["nodeName"]] not in ("p5en.48xlarge", "trn2.48xlarge")

    events = kubectl.json(
        "-n", namespace, "get", "events", "--field-selector", "involvedObject.kind=DisaggregatedServing"
    )["items"]
    reasons = {e["reason"] for e in events if e["involvedObject"]["name"] == "qwen3-32b"}
    assert {"Applied", "Ready"} <= reasons, reasons

    printed = kubectl("-n", namespace, "get", "dsv")
    assert "READY" in printed and "PREFILL" in printed and "BIDIRECTIONAL" in printed
    assert "True" in printed and "1/1" in printed


def test_children_are_owned_and_garbage_collected(op, kubectl, namespace, wait_for):
    kubectl.apply(seed(namespace))
    wait_for(lambda: children(kubectl, namespace) == EXPECTED_CHILDREN, timeout=60, what="children")
    uid = get_dsv(kubectl, namespace)["metadata"]["uid"]
    deploy = kubectl.json("-n", namespace, "get", "deployment", "qwen3-32b-decode")
    assert deploy["metadata"]["ownerReferences"][0]["uid"] == uid
    assert deploy["metadata"]["ownerReferences"][0]["controller"] is True
    kubectl("-n", namespace, "delete", "dsv", "qwen3-32b", "--wait=true", "--timeout=60s")
    wait_for(lambda: all(not v for v in children(kubectl, namespace).values()), timeout=90, what="children GC'd")
    wait_for(lambda: not kubectl.json("-n", namespace, "get", "pods")["items"], timeout=90, what="pods gone")


def test_drift_is_restored(op, kubectl, namespace, wait_for):
    kubectl.apply(seed(namespace))
    wait_for(lambda: is_ready(kubectl, namespace), timeout=120, what="Ready")
    kubectl("-n", namespace, "scale", "deployment", "qwen3-32b-decode", "--replicas=3")
    kubectl("-n", namespace, "delete", "configmap", "qwen3-32b-router")
    kubectl("-n", namespace, "delete", "service", "qwen3-32b-prefill")
    kubectl(
        "-n",
        namespace,
        "patch",
        "role",
        "qwen3-32b-router",
        "--type=json",
        "-p",
        '[{"op":"replace","path":"/rules/0/verbs","value":["get","list","watch","delete"]}]',
    )

    def restored() -> bool:
        d = kubectl.json("-n", namespace, "get", "deployment", "qwen3-32b-decode")
        role = kubectl.json("-n", namespace, "get", "role", "qwen3-32b-router")
        return (
            d["spec"]["replicas"] == 1
            and children(kubectl, namespace) == EXPECTED_CHILDREN
            and role["rules"][0]["verbs"] == ["get", "list", "watch"]
        )

    wait_for(restored, timeout=60, what="drift restored")
    cm = kubectl.json("-n", namespace, "get", "configmap", "qwen3-32b-router")
    assert json.loads(cm["data"]["router.json"])["conversation"]["ttl_seconds"] == 450


def test_scaling_a_role_moves_pods_and_status(op, kubectl, namespace, wait_for):
    kubectl.apply(seed(namespace))
    wait_for(lambda: is_ready(kubectl, namespace), timeout=120, what="Ready")
    kubectl("-n", namespace, "patch", "dsv", "qwen3-32b", "--type=merge", "-p", '{"spec":{"decode":{"replicas":2}}}')
    wait_for(
        lambda: len([p for p in pods(kubectl, namespace, "decode") if p["status"].get("phase") == "Running"]) == 2,
        timeout=90,
        what="2 decode pods running",
    )
    wait_for(lambda: get_dsv(kubectl, namespace)["status"]["decode"]["summary"] == "2/2", timeout=60, what="2/2")
    wait_for(lambda: is_ready(kubectl, namespace), timeout=60, what="Ready again")
    nodes = {p["spec"]["nodeName"] for p in pods(kubectl, namespace, "decode")}
    assert len(nodes) == 2  # a TP-8 engine takes a whole 8-GPU node


def test_engine_settings_roll_engines_router_settings_do_not(op, kubectl, namespace, wait_for):
    kubectl.apply(seed(namespace))
    wait_for(lambda: is_ready(kubectl, namespace), timeout=120, what="Ready")
    before = {r: kubectl.json("-n", namespace, "get", "deployment", f"qwen3-32b-{r}") for r in ("prefill", "decode")}
    hash_before = get_dsv(kubectl, namespace)["status"]["engineConfigHash"]

    # Router-only change: the ConfigMap follows, engine templates stay byte-identical.
    kubectl(
        "-n",
        namespace,
        "patch",
        "dsv",
        "qwen3-32b",
        "--type=merge",
        "-p",
        '{"spec":{"router":{"conversation":{"ttl":300}}}}',
    )
    wait_for(
        lambda: (
            json.loads(kubectl.json("-n", namespace, "get", "configmap", "qwen3-32b-router")["data"]["router.json"])[
                "conversation"
            ]["ttl_seconds"]
            == 300
        ),
        timeout=60,
        what="router config updated",
    )
    for r in ("prefill", "decode"):
        now = kubectl.json("-n", namespace, "get", "deployment", f"qwen3-32b-{r}")
        assert now["metadata"]["generation"] == before[r]["metadata"]["generation"], r
        assert now["spec"]["template"] == before[r]["spec"]["template"], r
    assert get_dsv(kubectl, namespace)["status"]["engineConfigHash"] == hash_before

    # Engine-facing change: TTL and threshold reach --kv-transfer-config and the pods roll.
    old_pods = {p["metadata"]["name"] for r in ("prefill", "decode") for p in pods(kubectl, namespace, r)}
    kubectl(
        "-n",
        namespace,
        "patch",
        "dsv",
        "qwen3-32b",
        "--type=merge",
        "-p",
        '{"spec":{"kvTransfer":{"decodeBlocksTTL":600,"recomputeThreshold":256}}}',
    )

    def rolled() -> bool:
        for r in ("prefill", "decode"):
            d = kubectl.json("-n", namespace, "get", "deployment", f"qwen3-32b-{r}")
            extra = kv_config(d)["kv_connector_extra_config"]
            if extra["decoder_kv_blocks_ttl"] != 600 or extra["kv_recompute_threshold"] != 256:
                return False
        current = {
            p["metadata"]["name"]
            for r in ("prefill", "decode")
            for p in pods(kubectl, namespace, r)
            if p["status"].get("phase") == "Running" and "deletionTimestamp" not in p["metadata"]
        }
        return len(current) == 2 and not (current & old_pods)

    wait_for(rolled, timeout=120, what="engines rolled with the new kv-transfer-config")
    wait_for(lambda: is_ready(kubectl, namespace), timeout=90, what="Ready after roll")
    assert get_dsv(kubectl, namespace)["status"]["engineConfigHash"] != hash_before


def test_invalid_specs_are_rejected_by_the_api_server(op, kubectl, namespace):
    cases = [
        (
            {"router__conversation__ttl": 480},
            "router.conversation.ttl must be strictly below kvTransfer.decodeBlocksTTL",
        ),
        ({"decode__tensorParallelSize": 4}, "decode.tensorParallelSize must be >= prefill.tensorParallelSize"),
        ({"prefill__extraArgs": ["--kv-transfer-config={}"]}, "use spec.kvTransfer instead"),
        ({"decode__extraArgs": ["--tensor-parallel-size", "4"]}, "use spec.decode.tensorParallelSize instead"),
        ({"model__extraArgs": ["--port=9000"]}, "--port is set by duplex"),
        ({"kvTransfer__decodeBlocksTTL": 0}, "should be greater than or equal to 60"),
        ({"prefill__replicas": -1}, "should be greater than or equal to 0"),
        ({"router__replicas": 2}, "router.replicas above 1 needs router.store.type redis"),
        ({"router__memory": "128Mi"}, "router.memory must be at least 256Mi"),
        ({"decode__extraArgs": ["--tensor_parallel_size=4"]}, "use spec.decode.tensorParallelSize instead"),
        ({"kvTransfer__sideChannelPort": 8000}, "kvTransfer.sideChannelPort must differ from 8000"),
        ({"kvTransfer__loadFailurePolicy": "explode"}, 'Unsupported value: "explode"'),
        ({"prefill__memory": None}, "network.efa.enabled needs prefill.memory and decode.memory"),
    ]
    for overrides, expected in cases:
        doc = seed(namespace, **overrides)
        if overrides.get("prefill__memory", 0) is None:
            doc["spec"]["prefill"].pop("memory")
        for dry in ("--dry-run=server", None):
            args = ["apply", "-f", "-"] + ([dry] if dry else [])
            with pytest.raises(AssertionError) as err:
                kubectl(*args, input=yaml.safe_dump(doc))
            assert expected in str(err.value), (overrides, str(err.value))
    # Unknown fields: strict field validation (kubectl's default) names the field.
    doc = seed(namespace)
    doc["spec"]["prefill"]["gpuCount"] = 8
    with pytest.raises(AssertionError) as err:
        kubectl("apply", "-f", "-", input=yaml.safe_dump(doc))
    assert 'unknown field "spec.prefill.gpuCount"' in str(err.value)
    # Name rule from the CRD's root CEL.
    doc = seed(namespace)
    doc["metadata"]["name"] = "x" * 56
    with pytest.raises(AssertionError) as err:
        kubectl("apply", "-f", "-", input=yaml.safe_dump(doc))
    assert "metadata.name must be a DNS-1035 label of at most 55 characters" in str(err.value)
    assert not kubectl.json("-n", namespace, "get", "dsv")["items"]


def test_rendered_messages_match_admission(op, kubectl, namespace, tmp_path):
    """duplex render refuses the same spec with the same rule message the API server gives."""
    import subprocess
    import sys

    doc = seed(namespace, router__conversation__ttl=500)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(doc))
    proc = subprocess.run(
        [sys.executable, "-m", "duplex.cli", "render", "-f", str(path)], capture_output=True, text=True
    )
    assert proc.returncode != 0
    with pytest.raises(AssertionError) as err:
        kubectl("apply", "--dry-run=server", "-f", str(path))
    message = "router.conversation.ttl must be strictly below kvTransfer.decodeBlocksTTL"
    assert message in proc.stderr and message in str(err.value)


def test_noop_resync_makes_zero_writes(op, cluster, kubectl, namespace, wait_for):
    kubectl.apply(seed(namespace))
    wait_for(lambda: is_ready(kubectl, namespace), timeout=120, what="Ready")
    # Let status settle (the last pod transitions), then watch several 2 s resync passes.
    wait_seconds(4)
    since = time.time()
    wait_seconds(10)
    writes = operator_writes(cluster.audit_log_path, since, namespace)
    assert writes == [], [(w["verb"], w["objectRef"]) for w in writes]
    # The same window was not idle: the operator kept resyncing (its own metrics count the passes).
    assert op.alive()
    passes = op.metric("duplex_reconciles_total", result="ok")
    wait_for(
        lambda: op.metric("duplex_reconciles_total", result="ok") >= passes + 2, timeout=20, what="more resync passes"
    )
    assert op.metric("duplex_managed_objects", namespace=namespace, serving="qwen3-32b", kind="Deployment") == 3
    assert op.metric("duplex_reconcile_duration_seconds_count") > 0


def test_operator_killed_mid_reconcile_converges_without_duplicates(op, kubectl, namespace, wait_for):
    kubectl.apply(seed(namespace))
    wait_for(lambda: any(children(kubectl, namespace).values()), timeout=60, what="first children")
    op.kill()
    op.start()
    wait_for(lambda: is_ready(kubectl, namespace), timeout=120, what="Ready after restart")
    assert children(kubectl, namespace) == EXPECTED_CHILDREN
    rs = kubectl.json("-n", namespace, "get", "replicasets", "-l", "duplex.dev/role=prefill")["items"]
    assert len([r for r in rs if r["spec"]["replicas"] > 0]) == 1
    assert len(pods(kubectl, namespace, "prefill")) == 1


def test_operator_survives_api_server_restart(op, cluster, kubectl, namespace, wait_for):
    kubectl.apply(seed(namespace))
    wait_for(lambda: is_ready(kubectl, namespace), timeout=120, what="Ready")
    cluster.restart_apiserver()
    kubectl("-n", namespace, "patch", "dsv", "qwen3-32b", "--type=merge", "-p", '{"spec":{"prefill":{"replicas":2}}}')
    wait_for(
        lambda: kubectl.json("-n", namespace, "get", "deployment", "qwen3-32b-prefill")["spec"]["replicas"] == 2,
        timeout=120,
        what="operator acted after the API server restart",
    )
    assert op.alive()


def test_operator_identity_is_least_privilege(op, cluster, kubectl):
    """The chart's ClusterRole is all the operator has: enough for every test above, nothing beyond."""
    as_operator = kubectl.as_kubeconfig(cluster.kubeconfig_for_user(OPERATOR_USER))
    allowed = [
        ("create", "deployments.apps"),
        ("patch", "disaggregatedservings.duplex.dev/status"),
        ("watch", "endpointslices.discovery.k8s.io"),
        ("create", "roles.rbac.authorization.k8s.io"),
    ]
    denied = [
        ("get", "secrets"),
        ("list", "pods"),
        ("create", "clusterroles.rbac.authorization.k8s.io"),
        ("delete", "namespaces"),
        ("create", "pods/exec"),
        ("update", "nodes"),
    ]
    for verb, resource in allowed:
        assert as_operator("auth", "can-i", verb, resource, "-A").strip() == "yes", (verb, resource)
    for verb, resource in denied:
        with pytest.raises(AssertionError):
            as_operator("auth", "can-i", verb, resource, "-A")

"""The operator against the real control plane: children, scheduling on fake EFA nodes, status, drift, rolls,
garbage collection, crash/restart convergence, API server restarts, idle resyncs that make no request (audit log),
deletion while the operator is down (no finalizer), API error classification, and RBAC."""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from operator_harness import (
    OPERATOR_USER,
    ROOT,
    OperatorProcess,
    operator_requests,
    operator_writes,
    query,
    resource,
    wait_seconds,
)

from duplex.api.meta import PLURAL
from duplex.apierrors import ApiError, Failure
from duplex.children.kinds import CHILD_KINDS, CONFIG_MAP, OBSERVED_KINDS, WATCHED_CHILD_KINDS
from duplex.handlers import LEGACY_FINALIZER
from duplex.kube import Kube
from duplex.permissions import required
from duplex_sidecars.router.config import FabricReportConfig
from duplex_sidecars.router.fabric_report import FabricReporter

pytestmark = pytest.mark.cluster

SEED = yaml.safe_load((ROOT / "examples/seed.yaml").read_text())
CHILD_KIND_NAMES = (
    "serviceaccount",
    "role",
    "rolebinding",
    "configmap",
    "secret",
    "service",
    "networkpolicy",
    "deployment",
)
# What kopf watches for this operator: one LIST at start, then one WATCH each, resumed from the last resourceVersion.
# Kinds whose CRD may be absent are watched only where it is installed: not on this cluster (test_inference_pool_crd.py).
WATCHED = {
    "customresourcedefinitions",
    PLURAL,
    *(k.plural for k in (*WATCHED_CHILD_KINDS, *OBSERVED_KINDS) if not k.optional),
}
RESYNC_SECONDS = 2.0  # the harness's --resync-seconds
# A bound on a restarted operator's start (imports, login, LIST and WATCH of every kind): seconds when the machine
# is quiet, but over a minute has been seen on a 2-core machine shared with CPU vLLM engines.
START_TIMEOUT = 180.0


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
    for kind in CHILD_KIND_NAMES:
        items = kubectl.json("-n", namespace, "get", kind, "-l", "duplex.dev/serving=qwen3-32b")["items"]
        out[kind] = sorted(i["metadata"]["name"] for i in items)
    return out


EXPECTED_CHILDREN = {
    "serviceaccount": ["qwen3-32b-router"],
    "role": ["qwen3-32b-router"],
    "rolebinding": ["qwen3-32b-router"],
    "configmap": ["qwen3-32b-fabric", "qwen3-32b-guard", "qwen3-32b-router"],
    "secret": ["qwen3-32b-engine-key"],
    "service": ["qwen3-32b-decode", "qwen3-32b-drain", "qwen3-32b-prefill", "qwen3-32b-router"],
    "networkpolicy": ["qwen3-32b-decode", "qwen3-32b-prefill", "qwen3-32b-router"],
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
    # The label the operator's watches select on: the Service drops out of them (a DELETED event), so it looks
    # missing, and applying it puts the label back.
    kubectl("-n", namespace, "label", "service", "qwen3-32b-decode", "app.kubernetes.io/managed-by-")

    def restored() -> bool:
        d = kubectl.json("-n", namespace, "get", "deployment", "qwen3-32b-decode")
        role = kubectl.json("-n", namespace, "get", "role", "qwen3-32b-router")
        svc = kubectl.json("-n", namespace, "get", "service", "qwen3-32b-decode")
        return (
            d["spec"]["replicas"] == 1
            and children(kubectl, namespace) == EXPECTED_CHILDREN
            and role["rules"][0]["verbs"] == ["get", "list", "watch"]
            and svc["metadata"]["labels"].get("app.kubernetes.io/managed-by") == "duplex"
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
        ({"kvTransfer__recomputeThreshold": "auto"}, "must be Auto or a number of tokens from 0 to 1048576"),
        ({"kvTransfer__recomputeThreshold": -1}, "must be Auto or a number of tokens from 0 to 1048576"),
        ({"prefill__memory": None}, "network.efa.enabled needs prefill.memory and decode.memory"),
        ({"decode__accelerator": {"type": "aws.amazon.com/neuron"}}, "decode.accelerator.type must be the same"),
        ({"prefill__extraArgs": ["--kv-cache-dtype=fp8"]}, "must be the same on prefill and decode"),
        ({"decode__env": [{"name": "VLLM_ATTENTION_BACKEND", "value": "X"}]}, "set it in spec.model.env"),
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


def only_serving_left(kubectl: Any, namespace: str) -> bool:
    """No DisaggregatedServing of an earlier test is still around (their namespaces are deleted without waiting)."""
    items = kubectl.json("get", "dsv", "-A")["items"]
    return {i["metadata"]["namespace"] for i in items} <= {namespace}


def is_resumed_watch(ev: dict[str, Any]) -> bool:
    """kopf reopening one of its watch streams (they time out after 300 s) from the resourceVersion it last saw."""
    return ev["verb"] == "watch" and resource(ev) in WATCHED and bool(query(ev).get("resourceVersion"))


def passes_so_far(op: OperatorProcess) -> float:
    """Successful passes of a (re)started operator; 0 until its metrics endpoint answers."""
    try:
        return op.metric("duplex_reconciles_total", result="ok")
    except OSError:
        return 0.0


def summary(requests: list[dict[str, Any]]) -> list[tuple[str, str | None, str]]:
    return [(r["verb"], resource(r), r["requestURI"]) for r in requests]


def test_noop_resync_makes_zero_writes(op, cluster, kubectl, namespace, wait_for):
    kubectl.apply(seed(namespace))
    wait_for(lambda: is_ready(kubectl, namespace), timeout=120, what="Ready")
    wait_for(lambda: only_serving_left(kubectl, namespace), timeout=120, what="earlier tests' servings gone")
    # Let status settle (the last pod transitions), then watch several 2 s resync passes.
    wait_seconds(4)
    passes = op.metric("duplex_reconciles_total", result="ok")
    since = time.time()
    wait_seconds(10)
    until = time.time()
    writes = operator_writes(cluster.audit_log_path, since, namespace)
    assert writes == [], [(w["verb"], w["objectRef"]) for w in writes]
    # Nor any read but each pass's GET of its engine key Secret by name (Secrets are never listed or watched):
    # observed state comes from kopf's watch streams, which stay open through the window. Besides those GETs, the
    # only request an idle operator may make is kopf resuming a watch that timed out; no LIST, no other GET.
    requests = operator_requests(cluster.audit_log_path, since, until)
    key_reads = [r for r in requests if r["verb"] == "get" and resource(r) == "secrets"]
    assert {r["requestURI"] for r in key_reads} <= {f"/api/v1/namespaces/{namespace}/secrets/qwen3-32b-engine-key"}
    assert [r for r in requests if not is_resumed_watch(r) and r not in key_reads] == [], summary(requests)
    # The same window was not idle: the operator kept resyncing (its own metrics count the passes).
    assert op.alive()
    assert op.metric("duplex_reconciles_total", result="ok") >= passes + (until - since) / RESYNC_SECONDS - 2
    wait_for(
        lambda: op.metric("duplex_reconciles_total", result="ok") >= passes + 2, timeout=20, what="more resync passes"
    )
    assert op.metric("duplex_managed_objects", namespace=namespace, serving="qwen3-32b", kind="Deployment") == 3
    assert op.metric("duplex_reconcile_duration_seconds_count") > 0


def test_a_restarted_operator_lists_each_watched_kind_once_and_writes_nothing(
    op, cluster, kubectl, namespace, wait_for
):
    """What kopf itself does at start, exactly: discovery, one LIST per watched kind (children filtered by the
    managed-by label on the server), one WATCH each from that LIST's resourceVersion. Then the operator's passes,
    fed from those watches, find everything converged: no write, and no other read but each pass's GET of its
    engine key Secret by name (Secrets are never listed or watched)."""
    kubectl.apply(seed(namespace))
    wait_for(lambda: is_ready(kubectl, namespace), timeout=120, what="Ready")
    wait_for(lambda: only_serving_left(kubectl, namespace), timeout=120, what="earlier tests' servings gone")
    wait_seconds(4)
    op.stop()
    since = time.time()
    op.start()
    wait_for(lambda: passes_so_far(op) >= 3, timeout=START_TIMEOUT, what="3 passes after start")
    until = time.time()
    requests = operator_requests(cluster.audit_log_path, since, until)

    lists = sorted(resource(r) for r in requests if r["verb"] == "list")
    assert lists == sorted(WATCHED), summary(requests)
    watches = [r for r in requests if r["verb"] == "watch"]
    assert sorted(resource(r) for r in watches) == sorted(WATCHED), summary(requests)
    assert all(query(r).get("resourceVersion") for r in watches)
    for r in requests:
        if r["verb"] in ("list", "watch") and resource(r) in {k.plural for k in (*CHILD_KINDS, *OBSERVED_KINDS)}:
            assert query(r)["labelSelector"] == ["app.kubernetes.io/managed-by=duplex"], r["requestURI"]
    discovery = [r for r in requests if resource(r) is None]
    assert all(r["verb"] == "get" and re.fullmatch(r"/apis?(/[^/?]+){0,2}", r["requestURI"]) for r in discovery)
    assert len({r["requestURI"] for r in discovery}) == len(discovery)  # each document fetched once
    key_reads = [r for r in requests if r["verb"] == "get" and resource(r) == "secrets"]
    assert key_reads and {r["requestURI"] for r in key_reads} == {
        f"/api/v1/namespaces/{namespace}/secrets/qwen3-32b-engine-key"
    }, summary(key_reads)
    rest = [r for r in requests if r not in discovery and r not in key_reads and r["verb"] not in ("list", "watch")]
    assert rest == [], summary(rest)
    assert is_ready(kubectl, namespace)


def operator_watching_since(cluster: Any, since: float) -> bool:
    """The (re)started operator has listed every watched kind and has its watch streams open."""
    requests = operator_requests(cluster.audit_log_path, since)
    return {resource(r) for r in requests if r["verb"] == "watch"} >= WATCHED


def no_children(kubectl: Any, namespace: str) -> bool:
    return all(not names for names in children(kubectl, namespace).values())


def test_deleting_a_serving_while_the_operator_is_stopped(op, cluster, kubectl, namespace, wait_for):
    """No finalizer: the delete completes with no operator running, the real garbage collector removes the children
    through their owner references, and the operator, started again, recreates nothing."""
    kubectl.apply(seed(namespace))
    wait_for(lambda: children(kubectl, namespace) == EXPECTED_CHILDREN, timeout=60, what="children")
    assert not get_dsv(kubectl, namespace)["metadata"].get("finalizers")
    op.stop()
    kubectl("-n", namespace, "delete", "dsv", "qwen3-32b", "--wait=true", "--timeout=30s")
    assert not kubectl.json("-n", namespace, "get", "dsv")["items"]
    wait_for(lambda: no_children(kubectl, namespace), timeout=90, what="children garbage-collected")
    wait_for(lambda: not kubectl.json("-n", namespace, "get", "pods")["items"], timeout=90, what="pods gone")

    since = time.time()
    op.start()
    wait_for(lambda: operator_watching_since(cluster, since), timeout=START_TIMEOUT, what="the operator watching again")
    # A sentinel serving (no engine pods) proves the operator is converging while the deleted one stays gone.
    sentinel = seed(namespace, prefill__replicas=0, decode__replicas=0)
    sentinel["metadata"]["name"] = "sentinel"
    kubectl.apply(sentinel)
    wait_for(
        lambda: kubectl.json("-n", namespace, "get", "deployments", "-l", "duplex.dev/serving=sentinel")["items"],
        timeout=60,
        what="the sentinel's children",
    )
    wait_seconds(3 * RESYNC_SECONDS)
    assert no_children(kubectl, namespace)
    touched = {w["objectRef"].get("name", "") for w in operator_writes(cluster.audit_log_path, since, namespace)}
    assert not {n for n in touched if n.startswith("qwen3-32b")}, touched


def test_a_finalizer_left_by_an_older_operator_comes_off(op, kubectl, namespace, wait_for):
    """Earlier versions kept a finalizer on every serving (kopf's, for their per-object daemon). An object deleted
    while such an operator was down stays Terminating; the current operator takes the finalizer off and the
    deletion completes."""
    op.stop()
    doc = seed(namespace, prefill__replicas=0, decode__replicas=0)
    doc["metadata"]["finalizers"] = [LEGACY_FINALIZER]
    kubectl.apply(doc)
    kubectl("-n", namespace, "delete", "dsv", "qwen3-32b", "--wait=false")
    assert get_dsv(kubectl, namespace)["metadata"].get("deletionTimestamp")  # held by the old finalizer
    op.start()
    wait_for(
        lambda: not kubectl.json("-n", namespace, "get", "dsv")["items"],
        timeout=START_TIMEOUT,
        what="the serving deleted",
    )
    # And one created with it (an older manifest, or a restore) simply loses it.
    kubectl.apply(doc)
    wait_for(
        lambda: not get_dsv(kubectl, namespace)["metadata"].get("finalizers"), timeout=60, what="finalizer removed"
    )


def test_api_errors_are_classified_as_the_real_api_server_reports_them(op, cluster, kubectl, namespace, wait_for):
    """Kube raises ApiError read from status code, reason and causes: here on real answers, not on guesses."""
    from kubernetes import config

    kube = Kube(config.new_client_from_config(config_file=str(cluster.kubeconfig_for_user(OPERATOR_USER))))
    probe = CONFIG_MAP.manifest({"name": "probe", "namespace": namespace}, data={"a": "1"})
    assert kube.apply(probe)["metadata"]["resourceVersion"]

    with pytest.raises(ApiError) as gone:
        kube.apply(CONFIG_MAP.manifest({"name": "probe", "namespace": f"{namespace}-absent"}))
    assert (gone.value.status, gone.value.failure) == (404, Failure.NOT_FOUND)

    with pytest.raises(ApiError) as denied:  # the operator may not touch Secrets
        kube._request(
            "PATCH", f"/api/v1/namespaces/{namespace}/secrets/x", body={}, content_type="application/merge-patch+json"
        )
    assert (denied.value.status, denied.value.reason, denied.value.failure) == (403, "Forbidden", Failure.PERMANENT)

    # Hold the namespace in Terminating with a finalizer, then try to create in it.
    kubectl(
        "-n",
        namespace,
        "patch",
        "configmap",
        "probe",
        "--type=merge",
        "-p",
        '{"metadata":{"finalizers":["duplex.dev/test-hold"]}}',
    )
    kubectl("delete", "namespace", namespace, "--wait=false")
    wait_for(
        lambda: kubectl.json("get", "namespace", namespace)["status"]["phase"] == "Terminating",
        timeout=30,
        what="namespace Terminating",
    )
    try:
        with pytest.raises(ApiError) as terminating:
            kube.apply(CONFIG_MAP.manifest({"name": "new", "namespace": namespace}))
        err = terminating.value
        assert (err.status, err.reason, err.failure) == (403, "Forbidden", Failure.NAMESPACE_TERMINATING)
        assert "NamespaceTerminating" in err.causes
    finally:
        kubectl(
            "-n", namespace, "patch", "configmap", "probe", "--type=merge", "-p", '{"metadata":{"finalizers":null}}'
        )


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
    # Everything duplex.permissions derives (the unit tier holds the ClusterRole equal to it) is granted for real.
    # But for kinds whose CRD this cluster lacks: `auth can-i` says no to a resource the server does not serve
    # (test_inference_pool_crd.py has the operator write InferencePools under this ClusterRole).
    unserved = {(k.group, k.plural) for k in CHILD_KINDS if k.optional}
    for group, res, verb in sorted(p for p in required() if p[:2] not in unserved):
        name, _, sub = res.partition("/")
        allowed.append((verb, f"{name}.{group}" + (f"/{sub}" if sub else "") if group else res))
    denied = [
        ("patch", "secrets"),  # the engine key is created once, never changed
        ("update", "secrets"),
        ("list", "secrets"),  # ... and read by name: no Secret the operator does not name
        ("watch", "secrets"),
        ("get", "pods"),  # engine pods are watched for their preflight reports, never read one by one
        ("update", "pods"),  # patched only with a decode scale-in's deletion costs
        ("delete", "pods"),
        ("create", "clusterroles.rbac.authorization.k8s.io"),
        ("delete", "namespaces"),
        ("create", "pods/exec"),
        ("update", "nodes"),
        ("get", "deployments.apps"),  # reads come from the watch
        ("update", "disaggregatedservings.duplex.dev"),
    ]
    for verb, resource_ in allowed:
        assert as_operator("auth", "can-i", verb, resource_, "-A").strip() == "yes", (verb, resource_)
    for verb, resource_ in denied:
        with pytest.raises(AssertionError):
            as_operator("auth", "can-i", verb, resource_, "-A")


def generations(kubectl: Any, namespace: str) -> dict[str, int]:
    items = kubectl.json("-n", namespace, "get", "deployments", "-l", "duplex.dev/serving=qwen3-32b")["items"]
    return {d["metadata"]["name"]: d["metadata"]["generation"] for d in items}


def router_config_of(kubectl: Any, namespace: str) -> dict[str, Any]:
    cm = kubectl.json("-n", namespace, "get", "configmap", "qwen3-32b-router")
    return json.loads(cm["data"]["router.json"])


def router_reporter(kubectl: Any, namespace: str, tmp_path: Path) -> Callable[[dict[str, Any]], None]:
    """Publishes a verdict as the router pod qwen3-32b-router-abc12 does (router/fabric_report.py): under the
    identity the operator rendered for the router (its ServiceAccount's token, its Role)."""
    kubeconfig = kubectl.service_account_kubeconfig(namespace, "qwen3-32b-router", tmp_path / "router.kubeconfig")
    rendered = router_config_of(kubectl, namespace)["fabric"]["report"]
    report = FabricReportConfig.model_validate({**rendered, "kubeconfig": str(kubeconfig)})

    async def publish_once(verdict: dict[str, Any]) -> bool:
        reporter = FabricReporter(report, lambda: verdict, check_every=3600)
        await reporter.start()
        try:
            return await reporter.publish()
        finally:
            await reporter.stop()

    def publish(verdict: dict[str, Any]) -> None:
        os.environ[report.pod_name_env] = "qwen3-32b-router-abc12"
        try:
            assert asyncio.run(publish_once(verdict))
        finally:
            del os.environ[report.pod_name_env]

    return publish


def test_a_router_fabric_report_becomes_kv_transfer_healthy(op, kubectl, namespace, wait_for, tmp_path):
    """A report written as the router writes it, under the identity the operator rendered for the router (its
    ServiceAccount's token, its Role), turns into the KVTransferHealthy condition, and its canary result into
    DisaggregationVerified; the operator's applies leave it."""
    kubectl.apply(seed(namespace))
    wait_for(lambda: is_ready(kubectl, namespace), timeout=120, what="Ready=True")
    assert condition(get_dsv(kubectl, namespace), "KVTransferHealthy")["reason"] == "NoReports"

    publish = router_reporter(kubectl, namespace, tmp_path)
    slow = "KV transfers at 0.08 GB/s on prefill http://10.1.2.3:8000, below the 1 GB/s expected of LIBFABRIC"
    verdict = {"healthy": False, "measured": True, "message": slow, "backend": "LIBFABRIC"}
    publish(verdict)

    def degraded() -> bool:
        c = condition(get_dsv(kubectl, namespace), "KVTransferHealthy")
        return bool(c and c["status"] == "False")

    wait_for(degraded, timeout=60, what="KVTransferHealthy=False")
    c = condition(get_dsv(kubectl, namespace), "KVTransferHealthy")
    assert c["reason"] == "TransfersDegraded" and c["message"] == f"router qwen3-32b-router-abc12: {slow}"
    assert condition(get_dsv(kubectl, namespace), "Ready")["status"] == "True"
    assert condition(get_dsv(kubectl, namespace), "DisaggregationVerified")["reason"] == "Pending"

    # The canary's result in the same report, run on the engine pods (kwok gives them IPs): DisaggregationVerified.
    pods = kubectl.json("-n", namespace, "get", "pods", "-l", "duplex.dev/serving=qwen3-32b")["items"]
    ip = {p["metadata"]["labels"]["duplex.dev/role"]: p["status"]["podIP"] for p in pods if p["status"].get("podIP")}
    assert {"prefill", "decode"} <= set(ip), pods
    verdict["canary"] = {"ok": False, "step": "d_to_p", "message": "d_to_p: prefill recomputed", "run": 1,
                         "prefill": f"http://{ip['prefill']}:8000", "decode": f"http://{ip['decode']}:8000"}  # fmt: skip
    publish(verdict)

    def unverified() -> bool:
        c = condition(get_dsv(kubectl, namespace), "DisaggregationVerified")
        return bool(c and c["status"] == "False")

    wait_for(unverified, timeout=60, what="DisaggregationVerified=False")
    c = condition(get_dsv(kubectl, namespace), "DisaggregationVerified")
    assert c["reason"] == "PrefillDidNotReadBack" and "d_to_p: prefill recomputed" in c["message"]

    # The operator re-applies the ConfigMap (it looks missing without the label its watch selects on); the report,
    # a field of the router's writes, stays.
    kubectl("-n", namespace, "label", "configmap", "qwen3-32b-fabric", "app.kubernetes.io/managed-by-")

    def fabric() -> dict[str, Any]:
        return kubectl.json("-n", namespace, "get", "configmap", "qwen3-32b-fabric")

    wait_for(lambda: fabric()["metadata"]["labels"].get("app.kubernetes.io/managed-by") == "duplex", timeout=60)
    assert json.loads(fabric()["data"]["qwen3-32b-router-abc12"])["message"] == slow


def test_recompute_threshold_auto_follows_the_routers_measurement(op, kubectl, namespace, wait_for, tmp_path):
    """recomputeThreshold: Auto on the real API server: the initial value until a router reports a fit, then its
    break-even in status and in the router's config, and no engine rolls for it."""
    kubectl.apply(seed(namespace, kvTransfer__recomputeThreshold="Auto"))
    wait_for(lambda: is_ready(kubectl, namespace), timeout=120, what="Ready=True")
    kv = get_dsv(kubectl, namespace)["status"]["effectiveKV"]
    assert (kv["recomputeThreshold"], kv["engineRecomputeThreshold"]) == (64, 16)
    assert kv["recomputeCalibration"]["reason"] == "Initial"
    assert router_config_of(kubectl, namespace)["reuse"]["min_tokens"] == 64
    engines = generations(kubectl, namespace)

    fit = {"compute_seconds_per_token": 5.5e-3, "read_seconds_per_token": 1.5e-5, "replay_overhead_seconds": 1.1,
           "recomputes": 40, "replays": 40, "threshold": 201}  # fmt: skip
    router_reporter(kubectl, namespace, tmp_path)(
        {"healthy": True, "measured": True, "message": "ok", "calibration": fit}
    )
    wait_for(lambda: router_config_of(kubectl, namespace)["reuse"]["min_tokens"] == 201, timeout=60,
             what="the router's threshold from its measurement")  # fmt: skip
    kv = get_dsv(kubectl, namespace)["status"]["effectiveKV"]
    assert kv["recomputeThreshold"] == 201 and kv["recomputeCalibration"]["reason"] == "Measured"
    assert kv["recomputeCalibration"]["computeSecondsPerToken"] == 5.5e-3
    assert generations(kubectl, namespace) == engines


def secret_key(kubectl: Any, namespace: str) -> tuple[str, str]:
    """(the engine key, the Secret's resourceVersion)."""
    secret = kubectl.json("-n", namespace, "get", "secret", "qwen3-32b-engine-key")
    return base64.b64decode(secret["data"]["api-key"]).decode(), secret["metadata"]["resourceVersion"]


def test_the_engines_are_fenced_and_keyed_on_the_api_server(op, kubectl, namespace, wait_for):
    """kwok enforces no NetworkPolicy, so the policies are checked as stored: selectors that match the pods the
    Deployments made, and the ports. The engine key: random, created once, read by engines and router from the
    Secret, never rotated by a pass, never in status, Events or the operator's log; a deleted Secret comes back."""
    kubectl.apply(seed(namespace))
    wait_for(lambda: is_ready(kubectl, namespace), timeout=120, what="Ready=True")

    role_pods = {role: pods(kubectl, namespace, role) for role in ("prefill", "decode", "router")}
    for role, peer in (("prefill", "decode"), ("decode", "prefill")):
        policy = kubectl.json("-n", namespace, "get", "networkpolicy", f"qwen3-32b-{role}")["spec"]
        selected = kubectl.json("-n", namespace, "get", "pods", "-l", ",".join(
            f"{k}={v}" for k, v in policy["podSelector"]["matchLabels"].items()))["items"]  # fmt: skip
        assert [p["metadata"]["name"] for p in selected] == [p["metadata"]["name"] for p in role_pods[role]]
        router_rule, scrape_rule, peer_rule = policy["ingress"]
        assert router_rule == {"from": [{"podSelector": {"matchLabels": {"duplex.dev/serving": "qwen3-32b",
                               "duplex.dev/role": "router"}}}], "ports": [{"protocol": "TCP", "port": 8000}]}  # fmt: skip
        assert scrape_rule["from"][0]["namespaceSelector"]["matchExpressions"][0]["values"] == ["monitoring"]
        assert peer_rule["from"] == [{"podSelector": {"matchLabels": {"duplex.dev/serving": "qwen3-32b",
                                     "duplex.dev/role": peer}}}]  # fmt: skip
        assert peer_rule["ports"][0] == {"protocol": "TCP", "port": 5600}
        assert {(p["port"], p.get("endPort")) for p in peer_rule["ports"][1:]} == {(1024, 7999), (8001, 65535)}
    router_policy = kubectl.json("-n", namespace, "get", "networkpolicy", "qwen3-32b-router")["spec"]
    (api_rule, drain_rule, admin_rule) = router_policy["ingress"]
    assert api_rule == {"ports": [{"protocol": "TCP", "port": 8000}]}  # the API edge: open
    assert admin_rule["ports"] == [{"protocol": "TCP", "port": 9090}]  # /metrics and the topology: scrapers only
    assert admin_rule["from"] == scrape_rule["from"]
    # ... and this serving's decode pods, whose preStop hook asks what they still hold (/drain, with the engine key)
    assert drain_rule == {
        "from": [{"podSelector": {"matchLabels": {"duplex.dev/serving": "qwen3-32b", "duplex.dev/role": "decode"}}}],
        "ports": [{"protocol": "TCP", "port": 9090}],
    }

    key, version = secret_key(kubectl, namespace)
    assert len(key) >= 43
    ref = {"secretKeyRef": {"name": "qwen3-32b-engine-key", "key": "api-key"}}
    for role, var in (("prefill", "VLLM_API_KEY"), ("decode", "VLLM_API_KEY"), ("router", "DUPLEX_ENGINE_API_KEY")):
        (container,) = role_pods[role][0]["spec"]["containers"]
        assert {"name": var, "valueFrom": ref} in container["env"], role
    config = json.loads(kubectl.json("-n", namespace, "get", "configmap", "qwen3-32b-router")["data"]["router.json"])
    assert config["engine_api_key_env"] == "DUPLEX_ENGINE_API_KEY"

    wait_seconds(3 * RESYNC_SECONDS)  # passes go by: the key stays as it was
    assert secret_key(kubectl, namespace) == (key, version)
    events = kubectl("-n", namespace, "get", "events", "-o", "json")
    assert key not in json.dumps(get_dsv(kubectl, namespace)) and key not in events
    assert key not in op.log_path.read_text()

    def key_uids() -> set[str]:
        return {
            (d["spec"]["template"]["metadata"].get("annotations") or {}).get("duplex.dev/engine-key-uid", "")
            for d in kubectl.json("-n", namespace, "get", "deployments", "-l", "duplex.dev/serving=qwen3-32b")["items"]
        }

    old_uid = kubectl.json("-n", namespace, "get", "secret", "qwen3-32b-engine-key")["metadata"]["uid"]
    assert key_uids() == {old_uid}  # the pods read this Secret's key
    kubectl("-n", namespace, "delete", "secret", "qwen3-32b-engine-key", "--wait=true")
    wait_for(lambda: "qwen3-32b-engine-key" in children(kubectl, namespace)["secret"], timeout=60, what="a new key")
    again, _ = secret_key(kubectl, namespace)
    assert again != key and len(again) >= 43
    new_uid = kubectl.json("-n", namespace, "get", "secret", "qwen3-32b-engine-key")["metadata"]["uid"]
    # engines and router roll together onto the new key, so no pod holds the old one
    wait_for(lambda: key_uids() == {new_uid}, timeout=60, what="workloads rolled onto the new key")
    wait_for(lambda: is_ready(kubectl, namespace), timeout=120, what="Ready on the new key")


def test_a_key_secret_name_taken_by_someone_else_is_reported_and_then_given_back(op, kubectl, namespace, wait_for):
    """A Secret of the user's already named <serving>-engine-key: no workload starts on a key the router does not hold,
    a Warning Event says what to do; once it is gone, the operator makes its own and the serving becomes Ready."""
    kubectl("-n", namespace, "create", "secret", "generic", "qwen3-32b-engine-key", "--from-literal=api-key=theirs")
    kubectl.apply(seed(namespace))

    def warnings() -> list[dict[str, Any]]:
        events = kubectl.json("-n", namespace, "get", "events")["items"]
        return [e for e in events if e["reason"] == "EngineKeyConflict"]

    wait_for(lambda: bool(warnings()), timeout=60, what="an EngineKeyConflict Event")
    (warning, *_) = warnings()
    assert warning["type"] == "Warning" and warning["involvedObject"]["name"] == "qwen3-32b"
    assert "Secret qwen3-32b-engine-key exists and is not this serving's (no owner)" in warning["message"]
    assert "theirs" not in json.dumps(warnings())
    assert children(kubectl, namespace)["deployment"] == []
    kubectl("-n", namespace, "delete", "secret", "qwen3-32b-engine-key")
    wait_for(lambda: is_ready(kubectl, namespace), timeout=180, what="Ready=True with the operator's own key")
    key, _ = secret_key(kubectl, namespace)
    assert key != "theirs" and len(key) >= 43


def test_a_fabric_override_is_accepted_with_a_warning(op, kubectl, namespace, wait_for):
    """FI_PROVIDER=tcp on an EFA spec: accepted (ConfigValid True, ValidWithWarnings) with a ConfigWarning Event."""
    kubectl.apply(seed(namespace, model__env=[{"name": "FI_PROVIDER", "value": "tcp"}]))

    def warned() -> bool:
        c = condition(get_dsv(kubectl, namespace), "ConfigValid")
        return bool(c and c["reason"] == "ValidWithWarnings")

    wait_for(warned, timeout=60, what="ConfigValid ValidWithWarnings")
    c = condition(get_dsv(kubectl, namespace), "ConfigValid")
    assert c["status"] == "True" and "spec.model.env[0] sets FI_PROVIDER" in c["message"]
    assert "silent TCP fallback" in c["message"]
    events = kubectl.json(
        "-n", namespace, "get", "events", "--field-selector", "involvedObject.kind=DisaggregatedServing"
    )["items"]
    (warning,) = [e for e in events if e["reason"] == "ConfigWarning"]
    assert warning["type"] == "Warning" and warning["message"] == c["message"]


def test_preflight_reports_in_engine_pods_become_fabric_ready(op, kubectl, namespace, wait_for):
    """kwok runs no container, so the kubelet's part is played here: the preflight init container's termination
    message is written into the pod's status as the kubelet would, and the operator turns it into FabricReady."""
    kubectl.apply(seed(namespace))
    wait_for(lambda: is_ready(kubectl, namespace), timeout=120, what="Ready=True")
    (prefill_pod,) = pods(kubectl, namespace, "prefill")
    names = [c["name"] for c in prefill_pod["spec"]["initContainers"]]
    assert names == ["preflight-install", "preflight"]
    assert condition(get_dsv(kubectl, namespace), "FabricReady")["reason"] == "Pending"

    failed = {"version": 1, "ok": False, "backend": "LIBFABRIC", "checks": [
        {"name": "efa_devices", "status": "fail", "value": "0 of 16", "message": "found 0 of 16 EFA devices"}]}  # fmt: skip
    status = {"initContainerStatuses": [
        {"name": "preflight-install", "ready": False, "restartCount": 0, "image": "duplex", "imageID": "",
         "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}},
        {"name": "preflight", "ready": False, "restartCount": 0, "image": "vllm", "imageID": "",
         "state": {"terminated": {"exitCode": 1, "reason": "Error", "message": json.dumps(failed)}}}]}  # fmt: skip
    kubectl("-n", namespace, "patch", "pod", prefill_pod["metadata"]["name"], "--subresource=status",
            "--type=merge", "-p", json.dumps({"status": status}))  # fmt: skip

    def fabric() -> dict[str, Any]:
        return condition(get_dsv(kubectl, namespace), "FabricReady") or {}

    wait_for(lambda: fabric().get("status") == "False", timeout=60, what="FabricReady=False")
    assert fabric()["reason"] == "EfaDevices"
    assert fabric()["message"] == f"pod {prefill_pod['metadata']['name']}: efa_devices: found 0 of 16 EFA devices"

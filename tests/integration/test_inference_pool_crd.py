"""router.inferencePool against the real API server and the Gateway API Inference Extension's own InferencePool CRD
(pinned in hack/versions.sh, fetched by hack/build-tools.sh, never committed): what the operator renders is
accepted as is, stays covered after the server's defaulting (a resync writes nothing), selects exactly the router
pods; a broken pool is refused by the extension's schema. The operator starts on a cluster without that CRD,
applies the workloads of a serving that enables the pool, and serves the pool once the CRD is installed; it puts a
changed pool back and deletes the pool when the serving disables it.

The CRD is removed again at the end of the module: the other modules run on a cluster without the extension."""

from __future__ import annotations

import copy
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from operator_harness import OPERATOR_USER, ROOT, OperatorProcess

from duplex.children.inference_pool import LLM_D_ROLE_LABEL
from duplex.children.kinds import CHILD_VERBS
from duplex.converge import covers
from duplex.render import desired_children, parse
from duplex_dev.launch.operator import wait_established

pytestmark = pytest.mark.cluster

POOL_CRD = "inferencepools.inference.networking.k8s.io"
SEED = yaml.safe_load((ROOT / "examples/seed.yaml").read_text())
NAME = SEED["metadata"]["name"]
POOL = f"{NAME}-router"
PICKER = {"name": f"{NAME}-epp", "port": 9002}


def crd_file() -> Path:
    """The pinned CRD, as hack/build-tools.sh caches it. Missing is a failure, never a skip (see conftest.py)."""
    out = subprocess.run(
        ["bash", str(ROOT / "hack/build-tools.sh"), "--print-gie-crd"], capture_output=True, text=True, check=True
    )
    path = Path(out.stdout.strip().splitlines()[-1])
    if not path.is_file():
        pytest.fail(f"{path} is missing: run hack/setup.sh (or bash hack/build-tools.sh)", pytrace=False)
    return path


def install_crd(kubectl: Any) -> None:
    kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crd_file()))
    wait_established(kubectl, POOL_CRD)


@pytest.fixture(scope="module", autouse=True)
def without_the_crd_at_first(kubectl: Any) -> Iterator[None]:
    """The module starts (and its operator with it) on a cluster without the extension, and leaves it so."""
    kubectl("delete", "crd", POOL_CRD, "--ignore-not-found", "--wait=true", timeout=120)
    yield
    kubectl("delete", "crd", POOL_CRD, "--ignore-not-found", "--wait=true", timeout=120)


@pytest.fixture
def crd(kubectl: Any) -> None:
    install_crd(kubectl)


def serving(namespace: str, pool: dict[str, Any] | None) -> dict[str, Any]:
    doc = copy.deepcopy(SEED)
    doc["metadata"]["namespace"] = namespace
    if pool is not None:
        doc["spec"].setdefault("router", {})["inferencePool"] = pool
    return doc


def rendered_pool(namespace: str, pool: dict[str, Any]) -> dict[str, Any]:
    (obj,) = [o for o in desired_children(parse(serving(namespace, pool))) if o["kind"] == "InferencePool"]
    return obj


def get(kubectl: Any, namespace: str, kind: str, name: str) -> dict[str, Any] | None:
    found = kubectl.json("-n", namespace, "get", kind, "--field-selector", f"metadata.name={name}")
    items: list[dict[str, Any]] = found.get("items") or []
    return items[0] if items else None


def server_side_apply(kubectl: Any, obj: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    argv = [
        str(kubectl.binary),
        f"--kubeconfig={kubectl.kubeconfig}",
        "apply",
        "--server-side",
        "-o",
        "json",
        "-f",
        "-",
    ]
    return subprocess.run(argv, input=json.dumps(obj), capture_output=True, text=True, timeout=60, check=False)


def is_ready(kubectl: Any, namespace: str) -> bool:
    obj = kubectl.json("-n", namespace, "get", "disaggregatedserving", NAME)
    ready = [c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == "Ready"]
    return bool(ready and ready[0]["status"] == "True")


def engine_pod_labels(kubectl: Any, namespace: str, role: str) -> dict[str, str]:
    deployment = get(kubectl, namespace, "deployment", f"{NAME}-{role}")
    assert deployment is not None
    labels: dict[str, str] = deployment["spec"]["template"]["metadata"]["labels"]
    return labels


# --- the operator ---------------------------------------------------------------------------------------------------


def test_without_the_crd_the_workloads_go_out_and_the_pool_follows_the_crd(
    op: OperatorProcess, kubectl: Any, namespace: str, wait_for: Any
) -> None:
    """The operator started on a cluster without the extension: a serving that enables the pool still gets its
    workloads (the pool is applied last), and once the CRD is installed, kopf watches the new kind and the next pass
    applies the pool: owned by the serving, selecting exactly its router pods, on their API port."""
    kubectl("delete", "crd", POOL_CRD, "--ignore-not-found", "--wait=true", timeout=120)
    op.stop()  # so that it starts without the CRD, whatever ran before
    op.start()
    kubectl.apply(serving(namespace, {"enabled": True, "endpointPicker": PICKER}))
    wait_for(
        lambda: all(get(kubectl, namespace, "deployment", f"{NAME}-{w}") for w in ("prefill", "decode", "router")),
        timeout=120,
        what="the three Deployments",
    )
    for role in ("prefill", "decode"):
        assert engine_pod_labels(kubectl, namespace, role)[LLM_D_ROLE_LABEL] == role
    assert op.alive()

    install_crd(kubectl)
    pool = wait_for(lambda: get(kubectl, namespace, "inferencepool", POOL), timeout=120, what="the InferencePool")
    parent = kubectl.json("-n", namespace, "get", "disaggregatedserving", NAME)
    (owner,) = pool["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("DisaggregatedServing", NAME, parent["metadata"]["uid"])
    assert pool["spec"]["endpointPickerRef"] == {
        "group": "",
        "kind": "Service",
        "name": PICKER["name"],
        "port": {"number": 9002},
        "failureMode": "FailOpen",
    }
    router = get(kubectl, namespace, "deployment", f"{NAME}-router")
    assert router is not None
    assert pool["spec"]["selector"]["matchLabels"] == router["spec"]["selector"]["matchLabels"]
    (ctr,) = router["spec"]["template"]["spec"]["containers"]
    assert pool["spec"]["targetPorts"] == [{"number": p["containerPort"]} for p in ctr["ports"] if p["name"] == "http"]
    # The passes complete again: the serving becomes Ready, and the pool's pods are its router pods, only them.
    wait_for(lambda: is_ready(kubectl, namespace), timeout=120, what="Ready")
    selector = ",".join(f"{k}={v}" for k, v in pool["spec"]["selector"]["matchLabels"].items())
    selected = kubectl.json("-n", namespace, "get", "pods", "-l", selector)["items"]
    routers = kubectl.json("-n", namespace, "get", "pods", "-l", "duplex.dev/role=router")["items"]
    assert selected and {p["metadata"]["name"] for p in selected} == {p["metadata"]["name"] for p in routers}


def test_a_changed_pool_is_put_back_and_disabling_deletes_it(
    op: OperatorProcess, kubectl: Any, namespace: str, crd: None, wait_for: Any
) -> None:
    kubectl.apply(serving(namespace, {"enabled": True}))
    wait_for(lambda: get(kubectl, namespace, "inferencepool", POOL), timeout=120, what="the InferencePool")

    kubectl(
        "-n", namespace, "patch", "inferencepool", POOL, "--type=merge", "-p", '{"spec":{"targetPorts":[{"number":9}]}}'
    )
    wait_for(
        lambda: (
            (get(kubectl, namespace, "inferencepool", POOL) or {}).get("spec", {}).get("targetPorts")
            == [{"number": 8000}]
        ),
        timeout=60,
        what="the operator to put the pool's targetPorts back",
    )

    kubectl.apply(serving(namespace, {"enabled": False}))
    wait_for(lambda: get(kubectl, namespace, "inferencepool", POOL) is None, timeout=60, what="the pool deleted")
    wait_for(
        lambda: all(LLM_D_ROLE_LABEL not in engine_pod_labels(kubectl, namespace, r) for r in ("prefill", "decode")),
        timeout=60,
        what="the engines without llm-d's label",
    )


# --- the rendered pool against the extension's schema ---------------------------------------------------------------


@pytest.mark.parametrize(
    "pool",
    [
        {"enabled": True},
        {"enabled": True, "endpointPicker": {"name": f"{NAME}-epp"}},
        {"enabled": True, "endpointPicker": {"name": "e" * 63, "port": 65535, "failureMode": "FailClose"}},
    ],
    ids=["no-picker", "picker-defaults", "picker-bounds"],
)
def test_the_rendered_pool_is_accepted_and_stays_covered_after_defaulting(
    kubectl: Any, namespace: str, crd: None, pool: dict[str, Any]
) -> None:
    desired = rendered_pool(namespace, pool)
    done = server_side_apply(kubectl, desired)
    assert done.returncode == 0, done.stderr
    stored = get(kubectl, namespace, "inferencepool", POOL)
    assert stored is not None
    # The server added its defaults (appProtocol, the picker's group and kind); the operator's next pass finds
    # everything it wants already there, so it writes nothing.
    assert stored["spec"]["appProtocol"] == "http"
    assert covers(stored, desired)
    assert stored["spec"]["selector"]["matchLabels"] == {"duplex.dev/serving": NAME, "duplex.dev/role": "router"}


@pytest.mark.parametrize(
    "breakage,message",
    [
        (lambda s: s["endpointPickerRef"]["port"].clear(), "number: Required value"),
        (lambda s: s["endpointPickerRef"].pop("port"), "port is required when kind is 'Service'"),
        (lambda s: s.update(targetPorts=[]), "spec.targetPorts: Invalid value"),
        (lambda s: s["selector"].update(matchLabels={}), "spec.selector.matchLabels: Invalid value"),
        (lambda s: s["endpointPickerRef"].update(failureMode="Sometimes"), 'Unsupported value: "Sometimes"'),
    ],
    ids=["picker-port-number", "picker-port", "no-target-port", "empty-selector", "failure-mode"],
)
def test_a_broken_pool_is_refused_by_the_extensions_schema(
    kubectl: Any, namespace: str, crd: None, breakage: Any, message: str
) -> None:
    pool = rendered_pool(namespace, {"enabled": True, "endpointPicker": PICKER})
    breakage(pool["spec"])
    done = server_side_apply(kubectl, pool)
    assert done.returncode != 0 and message in done.stderr, done.stderr
    assert get(kubectl, namespace, "inferencepool", POOL) is None


def test_the_operator_may_do_exactly_what_it_does_with_pools(
    op: OperatorProcess, cluster: Any, kubectl: Any, crd: None
) -> None:
    """The chart's ClusterRole on pools, once the server serves them (`auth can-i` says no to a kind it does not)."""
    as_operator = kubectl.as_kubeconfig(cluster.kubeconfig_for_user(OPERATOR_USER))
    for verb in CHILD_VERBS:
        assert as_operator("auth", "can-i", verb, POOL_CRD, "-A").strip() == "yes", verb
    for verb in ("get", "update", "deletecollection"):  # reads come from the watch; writes are server-side applies
        with pytest.raises(AssertionError):
            as_operator("auth", "can-i", verb, POOL_CRD, "-A")

"""The chart on the real local control plane: install into a namespace that enforces the restricted Pod Security
profile, the operator running under the identity the chart created, examples/seed.yaml reaching Ready; an upgrade
whose chart changes the CRD (the API server serves the new field), a rollback (it does not any more), and an
uninstall that leaves nothing behind but the kept CRD and the DisaggregatedServings. Then the namespaced mode."""

from __future__ import annotations

import copy
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from operator_harness import ROOT, free_port, wait_seconds

sys.path.insert(0, str(ROOT / "tests" / "observability"))

from chart_release import (
    CRD_NAME,
    ChartOperator,
    Helm,
    adopt_crd,
    operator_container,
    restore_generated_crd,
)
from tooling import CHART

pytestmark = pytest.mark.cluster

SEED = yaml.safe_load((ROOT / "examples" / "seed.yaml").read_text())
PROBE_FIELD = "upgradeProbe"
# Every kind the chart renders in any mode, with the label Helm's objects carry; the release Secrets have their own.
CHART_KINDS = (
    "deployments.apps", "replicasets.apps", "pods", "services", "serviceaccounts", "configmaps",
    "poddisruptionbudgets.policy", "roles.rbac.authorization.k8s.io", "rolebindings.rbac.authorization.k8s.io",
    "clusterroles.rbac.authorization.k8s.io", "clusterrolebindings.rbac.authorization.k8s.io",
    "customresourcedefinitions.apiextensions.k8s.io",
)  # fmt: skip


@pytest.fixture
def helm(cluster: Any, tmp_path: Path) -> Helm:
    return Helm(cluster.kubeconfig, tmp_path / "helm")


@pytest.fixture
def release_namespace(kubectl: Any) -> Iterator[str]:
    """The release's namespace, enforcing the restricted Pod Security profile: the operator pod must pass it."""
    name = f"duplex-system-{uuid.uuid4().hex[:6]}"
    kubectl("create", "namespace", name)
    kubectl(
        "label", "namespace", name,
        "pod-security.kubernetes.io/enforce=restricted", "pod-security.kubernetes.io/enforce-version=latest",
    )  # fmt: skip
    yield name
    kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found")


def local_ports(**extra: Any) -> dict[str, Any]:
    """Values whose ports are free here, since the operator of the rendered Deployment runs on this machine."""
    return {"operator": {"metricsPort": free_port(), "healthPort": free_port(), "resyncSeconds": 2, **extra}}


def seed(namespace: str, **spec: Any) -> dict[str, Any]:
    doc = copy.deepcopy(SEED)
    doc["metadata"]["namespace"] = namespace
    doc["spec"].update(spec)
    return doc


def ready(kubectl: Any, namespace: str, timeout: str = "180s") -> None:
    kubectl("-n", namespace, "wait", "--for=condition=Ready", "dsv/qwen3-32b", f"--timeout={timeout}", timeout=240)


def explains_probe_field(kubectl: Any) -> bool:
    """Whether `kubectl explain` (the API server's published OpenAPI) knows spec.upgradeProbe."""
    try:
        explained = kubectl("explain", f"disaggregatedservings.spec.{PROBE_FIELD}")
    except AssertionError as err:  # the conftest's KubectlError: 'field "upgradeProbe" does not exist'
        assert "does not exist" in str(err), err
        return False
    return "A field only the upgrade test's chart has." in explained


def accepts_probe_field(kubectl: Any, namespace: str) -> bool:
    """Whether the API server's schema has spec.upgradeProbe: a server-side apply (dry run) names undeclared fields."""
    doc = seed(namespace, **{PROBE_FIELD: "v2"})
    try:
        kubectl(
            "apply",
            "--server-side",
            "--dry-run=server",
            "--field-manager=chart-test",
            "-f",
            "-",
            input=yaml.safe_dump(doc),
        )
        return True
    except AssertionError as err:
        assert f".spec.{PROBE_FIELD}: field not declared in schema" in str(err), err
        return False


def chart_with_probe_field(tmp_path: Path) -> Path:
    """A copy of the chart whose CRD has one more spec field, as a release with a schema change would have."""
    import shutil

    chart = tmp_path / "duplex-next"
    shutil.copytree(CHART, chart)
    crd_path = chart / "files" / "crds" / "duplex.dev_disaggregatedservings.yaml"
    crd = yaml.safe_load(crd_path.read_text())
    (version,) = crd["spec"]["versions"]
    version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"][PROBE_FIELD] = {
        "type": "string",
        "maxLength": 64,
        "description": "A field only the upgrade test's chart has.",
    }
    crd_path.write_text(yaml.safe_dump(crd, sort_keys=False))
    return chart


def labelled(kubectl: Any, release: str) -> list[str]:
    """Every object left with the chart's labels, across all namespaces and the cluster-scoped kinds."""
    selector = f"app.kubernetes.io/instance={release},app.kubernetes.io/managed-by=Helm"
    found = kubectl("get", ",".join(CHART_KINDS), "-A", "-l", selector, "-o", "name", "--ignore-not-found")
    return sorted(line for line in found.splitlines() if line)


def can_i(kubectl: Any, verb: str, resource: str, namespace: str | None, user: str) -> str:
    scope = ["-n", namespace] if namespace else ["-A"]
    try:
        return kubectl("auth", "can-i", verb, resource, *scope, f"--as={user}").strip()
    except AssertionError:  # "no" exits 1
        return "no"


def exists(kubectl: Any, obj: dict[str, Any]) -> bool:
    ns = ["-n", obj["metadata"]["namespace"]] if obj["metadata"].get("namespace") else []
    api = obj["apiVersion"].split("/")[0] if "/" in obj["apiVersion"] else ""
    resource = f"{obj['kind'].lower()}.{api}" if api else obj["kind"].lower()
    return bool(kubectl(*ns, "get", resource, obj["metadata"]["name"], "--ignore-not-found", "-o", "name").strip())


def test_install_upgrade_rollback_uninstall(cluster, kubectl, helm, release_namespace, namespace, wait_for, tmp_path):
    release = "duplex"
    adopt_crd(
        kubectl, release, release_namespace
    )  # a CRD applied by hand (or by other tests) is adopted, not clobbered
    values = local_ports()
    operator: ChartOperator | None = None
    try:
        # ---- install ----
        notes = helm.install(release, release_namespace, values)
        assert "watches every namespace (ClusterRole and ClusterRoleBinding duplex)" in notes  # NOTES.txt
        assert "`helm uninstall` leaves it (helm.sh/resource-policy: keep)" in notes
        kubectl(
            "-n",
            release_namespace,
            "wait",
            "--for=condition=Ready",
            "pod",
            "-l",
            "app.kubernetes.io/instance=duplex",
            "--timeout=120s",
        )
        pod = kubectl.json("-n", release_namespace, "get", "pods", "-l", "app.kubernetes.io/instance=duplex")["items"][
            0
        ]
        assert pod["spec"]["securityContext"]["runAsNonRoot"] is True  # admitted under enforce=restricted
        crd = kubectl.json("get", "crd", CRD_NAME)
        assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
        assert crd["metadata"]["annotations"]["meta.helm.sh/release-name"] == release

        sa = kubectl.json("-n", release_namespace, "get", "deployment", "duplex")["spec"]["template"]["spec"][
            "serviceAccountName"
        ]
        identity = cluster.kubeconfig_for_serviceaccount(release_namespace, sa)
        container = operator_container(kubectl, release_namespace, "duplex")
        operator = ChartOperator(container, identity, tmp_path / "operator.log").start()

        kubectl.apply(seed(namespace))
        ready(kubectl, namespace)
        assert not accepts_probe_field(kubectl, namespace)
        # The default install reads no Secret it does not name (on EKS, kube-system's included): each pass GETs its
        # serving's engine key by name, and the serving's owner reference has the garbage collector delete it.
        user = f"system:serviceaccount:{release_namespace}:{sa}"
        for verb, answer in (("list", "no"), ("watch", "no"), ("delete", "no"), ("get", "yes"), ("create", "yes")):
            assert can_i(kubectl, verb, "secrets", "kube-system", user) == answer, verb

        # ---- upgrade: a chart whose CRD has a new field, and a changed value ----
        crd_version = kubectl.json("get", "crd", CRD_NAME)["metadata"]["resourceVersion"]
        helm.upgrade(release, release_namespace, local_ports(resyncSeconds=3), chart_with_probe_field(tmp_path))
        assert kubectl.json("get", "crd", CRD_NAME)["metadata"]["resourceVersion"] != crd_version
        kubectl("wait", "--for=condition=Established", f"crd/{CRD_NAME}", "--timeout=60s")
        wait_for(
            lambda: accepts_probe_field(kubectl, namespace), timeout=30, what="the API server serving the new field"
        )
        # The API server publishes the new schema to OpenAPI (what `kubectl explain` reads) a little after it accepts
        # the field (seen in CI: explain did not know the field yet right after the dry run took it).
        wait_for(lambda: explains_probe_field(kubectl), timeout=30, what="kubectl explain showing the new field")
        args = operator_container(kubectl, release_namespace, "duplex")["args"]
        assert args[args.index("--resync-seconds") + 1] == "3"
        ready(kubectl, namespace)  # the serving stays Ready through the operator's upgrade

        # ---- rollback to revision 1: the old schema and args come back ----
        helm("rollback", release, "1", "-n", release_namespace, "--wait", "--timeout", "180s")
        wait_for(lambda: not accepts_probe_field(kubectl, namespace), timeout=30, what="the field gone again")
        assert operator_container(kubectl, release_namespace, "duplex")["args"] == container["args"]
        assert [r["status"] for r in helm.revisions(release, release_namespace)] == [
            "superseded",
            "superseded",
            "deployed",
        ]
        ready(kubectl, namespace)

        # ---- uninstall: nothing of the chart's is left but the kept CRD ----
        made = helm.manifest(release, release_namespace)
        made_names = sorted(f"{o['kind']}/{o['metadata']['name']}" for o in made)
        assert made_names == sorted(
            ["ClusterRole/duplex", "ClusterRoleBinding/duplex", f"CustomResourceDefinition/{CRD_NAME}",
             "Deployment/duplex", "PodDisruptionBudget/duplex", "Service/duplex-metrics", "ServiceAccount/duplex"]
        )  # fmt: skip
        operator.stop()  # as the operator pod would go with the Deployment
        operator = None
        helm("uninstall", release, "-n", release_namespace, "--wait", "--timeout", "180s")
        wait_for(lambda: labelled(kubectl, release) == [f"customresourcedefinition.apiextensions.k8s.io/{CRD_NAME}"],
                 timeout=90, what="only the CRD left with the chart's labels (pods and ReplicaSets collected)")  # fmt: skip
        left = [f"{o['kind']}/{o['metadata']['name']}" for o in made if exists(kubectl, o)]
        assert left == [f"CustomResourceDefinition/{CRD_NAME}"]
        assert not kubectl("-n", release_namespace, "get", "secrets", "-l", f"owner=helm,name={release}", "-o", "name")
        assert helm("status", release, "-n", release_namespace, check=False).returncode != 0
        # The servings and what they run are untouched, and hold no finalizer: deleting one needs no operator.
        dsv = kubectl.json("-n", namespace, "get", "dsv", "qwen3-32b")
        assert not dsv["metadata"].get("finalizers")
        assert (
            len(kubectl.json("-n", namespace, "get", "deployments", "-l", "duplex.dev/serving=qwen3-32b")["items"]) == 3
        )

        # ---- install again: the kept CRD is adopted; the serving's deletion takes its children (owner references) ----
        helm.install(release, release_namespace, values)
        identity = cluster.kubeconfig_for_serviceaccount(release_namespace, sa)
        operator = ChartOperator(
            operator_container(kubectl, release_namespace, "duplex"), identity, tmp_path / "operator.log"
        ).start()
        kubectl("-n", namespace, "delete", "dsv", "qwen3-32b", "--wait=true", "--timeout=120s", timeout=180)
        wait_for(
            lambda: not kubectl.json("-n", namespace, "get", "deployments")["items"],
            timeout=90,
            what="children collected",
        )
        operator.stop()
        operator = None
        helm("uninstall", release, "-n", release_namespace, "--wait", "--timeout", "180s")
    finally:
        if operator is not None:
            print(f"----- operator log ({operator.log_path}) -----\n{operator.log_tail()}")
            operator.stop()
        helm("uninstall", release, "-n", release_namespace, "--ignore-not-found", check=False)
        restore_generated_crd(kubectl)


def test_namespaced_mode_watches_only_its_namespaces(
    cluster, kubectl, helm, release_namespace, namespace, wait_for, tmp_path
):
    restore_generated_crd(kubectl)  # the CRD is another release's (or a platform's) here: crds.install=false
    other = f"{namespace}-b"
    unwatched = f"{namespace}-c"
    for ns in (other, unwatched):
        kubectl("create", "namespace", ns)
    release = "duplex-ns"
    operator: ChartOperator | None = None
    try:
        notes = helm.install(
            release,
            release_namespace,
            local_ports() | {"watchNamespaces": [namespace, other], "crds": {"install": False, "keep": True}},
        )
        assert f"watches the namespaces {namespace}, {other} (a Role and RoleBinding in each)" in notes
        manifest = helm.manifest(release, release_namespace)
        assert {o["kind"] for o in manifest} == {
            "ServiceAccount",
            "Role",
            "RoleBinding",
            "ClusterRole",  # the cluster-scope rules only (CRD and namespace discovery)
            "ClusterRoleBinding",
            "Deployment",
            "Service",
            "PodDisruptionBudget",
        }
        assert sorted(o["metadata"]["namespace"] for o in manifest if o["kind"] == "Role") == sorted([namespace, other])

        sa = f"system:serviceaccount:{release_namespace}:{release}"
        for ns, allowed in ((namespace, "yes"), (other, "yes"), (unwatched, "no")):
            assert can_i(kubectl, "patch", "disaggregatedservings.duplex.dev", ns, sa) == allowed, ns
            assert can_i(kubectl, "create", "deployments.apps", ns, sa) == allowed, ns
        assert can_i(kubectl, "list", "disaggregatedservings.duplex.dev", None, sa) == "no"  # nothing cluster-wide

        identity = cluster.kubeconfig_for_serviceaccount(release_namespace, release)
        operator = ChartOperator(
            operator_container(kubectl, release_namespace, release), identity, tmp_path / "operator.log"
        ).start()
        kubectl.apply(seed(namespace))
        kubectl.apply(seed(unwatched))
        ready(kubectl, namespace)
        wait_seconds(6)  # three resyncs: the unwatched serving stays untouched
        untouched = kubectl.json("-n", unwatched, "get", "dsv", "qwen3-32b")
        assert "status" not in untouched and not untouched["metadata"].get("finalizers")
        assert not kubectl.json("-n", unwatched, "get", "deployments")["items"]
        kubectl("-n", namespace, "delete", "dsv", "qwen3-32b", "--wait=true", "--timeout=120s", timeout=180)
        assert "forbidden" not in operator.log_path.read_text().lower()  # the Roles and cluster-scope rules suffice
    finally:
        if operator is not None:
            print(f"----- operator log ({operator.log_path}) -----\n{operator.log_tail()}")
            operator.stop()
        helm("uninstall", release, "-n", release_namespace, "--wait", "--ignore-not-found", check=False)
        for ns in (other, unwatched):
            kubectl("delete", "namespace", ns, "--wait=false", "--ignore-not-found")
    for ns in (namespace, other):
        assert not kubectl.json("-n", ns, "get", "roles", "-l", f"app.kubernetes.io/instance={release}")["items"]

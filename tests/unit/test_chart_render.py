"""The Helm chart without a cluster: `helm lint --strict`, strict Kubernetes schemas for every rendered object, the
values schema, restricted Pod Security, RBAC from the one rule list, the CRD from crds/, and the monitoring toggles.
(tests/integration/test_chart.py installs, upgrades, rolls back and uninstalls it on the local control plane.)"""

from __future__ import annotations

import functools
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from kubernetes_validate import utils as kv_utils

from duplex import operator_cli
from duplex.children.labels import labels as child_labels
from duplex.children.router import STORE_MEMORY_SHARE
from duplex.policy import ENV as POLICY_ENV
from duplex.policy import Policy

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "observability"))

import tooling  # noqa: E402
from tooling import CHART, by_kind, one  # noqa: E402

RULES_FILE = CHART / "files" / "clusterrole.yaml"
CRD_SOURCE = ROOT / "crds" / "duplex.dev_disaggregatedservings.yaml"
CRD_COPY = CHART / "files" / "crds" / "duplex.dev_disaggregatedservings.yaml"
K8S = ".".join(tooling.K8S_VERSION.split(".")[:2])
MONITORING_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}
ALL_MONITORING = {
    "monitoring": {
        "labels": {"release": "kube-prometheus-stack"},
        "operator": {"serviceMonitor": True},
        "routers": {"podMonitor": True},
        "engines": {"podMonitor": True},
        "prometheusRule": {"enabled": True},
        "grafanaDashboard": {"enabled": True, "namespace": "grafana"},
    }
}
NAMESPACED = {"watchNamespaces": ["ml-a", "ml-b"]}
VARIANTS = {
    "default": None,
    "namespaced": NAMESPACED,
    "monitoring": ALL_MONITORING,
    "namespaced-monitoring": {**NAMESPACED, **ALL_MONITORING},
    "tuned": {
        "image": {"digest": "sha256:" + "ab" * 32},
        "operator": {"resyncSeconds": 15, "workers": 8, "verbose": True, "metricsPort": 9090, "healthPort": 9091},
        "policy": {
            "allowPrivilegedEFA": True,
            "allowedHostPathPrefixes": ["/mnt/raid0", "/data"],
            "allowedImagePrefixes": ["123456789012.dkr.ecr.us-west-2.amazonaws.com/", "ghcr.io/duplex-dev/"],
            "allowedSecrets": ["hf-token", "redis-url"],
            "allowedTolerationKeys": ["dedicated", "*"],
        },
        "serviceAccount": {"annotations": {"eks.amazonaws.com/role-arn": "arn:aws:iam::123456789012:role/duplex"}},
        "podLabels": {"team": "ml-platform"},
        "priorityClassName": "system-cluster-critical",
        "nodeSelector": {"node.kubernetes.io/instance-type": "m7i.4xlarge"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "platform", "effect": "NoSchedule"}],
        "crds": {"install": False, "keep": True},
    },
}


_RENDERED: dict[str, list[dict[str, Any]]] = {}


def render(tmp_path: Path, values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """`helm template` with these values, once per module (helm is the slow part of this file)."""
    key = json.dumps(values, sort_keys=True)
    if key not in _RENDERED:
        _RENDERED[key] = tooling.render(tmp_path, values)
    return json.loads(json.dumps(_RENDERED[key]))  # a copy: tests may not change each other's objects


def rules() -> list[dict[str, Any]]:
    return yaml.safe_load(RULES_FILE.read_text())["rules"]


@pytest.fixture(scope="module", autouse=True)
def cached_schemas():
    original = kv_utils.schema_contents
    kv_utils.schema_contents = functools.lru_cache(maxsize=None)(original)
    yield
    kv_utils.schema_contents = original


# ----- helm lint and Kubernetes schemas -------------------------------------------------------------------------


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_helm_lint_strict(variant: str, tmp_path: Path) -> None:
    argv = [tooling.helm(), "lint", "--strict", CHART, "--kube-version", tooling.K8S_VERSION]
    proc = tooling.run([*argv, *tooling.values_args(VARIANTS[variant], tmp_path)])
    assert "0 chart(s) failed" in proc.stdout


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_rendered_objects_pass_strict_kubernetes_schemas(variant: str, tmp_path: Path) -> None:
    objs = render(tmp_path, VARIANTS[variant])
    assert objs
    for obj in objs:
        if obj["kind"] in MONITORING_KINDS:
            continue  # prometheus-operator's kinds: not in kubernetes-validate; see test_monitoring_objects_*
        try:
            kubernetes_validate.validate(obj, K8S, strict=True)
        except kubernetes_validate.ValidationError as err:
            where = "/".join(str(p) for p in err.absolute_path)
            pytest.fail(f"{variant}: {obj['kind']} {obj['metadata']['name']}: {where}: {err.message}")


def test_default_render_is_exactly_the_operator_and_its_identity(tmp_path: Path) -> None:
    kinds = sorted(o["kind"] for o in render(tmp_path))
    assert kinds == sorted(
        [
            "CustomResourceDefinition",
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "Deployment",
            "Service",
            "PodDisruptionBudget",
        ]
    )


# ----- values schema --------------------------------------------------------------------------------------------


def _schema_objects(node: Any, path: str = "") -> list[tuple[str, dict[str, Any]]]:
    found = []
    if isinstance(node, dict):
        if node.get("type") == "object" and "properties" in node:
            found.append((path or "/", node))
        for key, child in node.items():
            found += _schema_objects(child, f"{path}/{key}")
    elif isinstance(node, list):
        for i, child in enumerate(node):
            found += _schema_objects(child, f"{path}/{i}")
    return found


def _leaf_paths(values: Any, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    if isinstance(values, dict) and values:
        return [p for key, child in values.items() for p in _leaf_paths(child, (*prefix, key))]
    return [prefix]


def test_values_schema_closes_every_object() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    objects = _schema_objects(schema)
    assert len(objects) > 10
    for path, node in objects:
        assert node.get("additionalProperties") is False, f"{path} accepts unknown keys"


def test_values_schema_covers_every_value() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    for path in _leaf_paths(values):
        node = schema
        for key in path:
            if isinstance(node.get("additionalProperties"), dict):
                break  # a map (labels, annotations): its values have one schema, whatever the key
            props = node.get("properties") or {}
            assert key in props, f"values.yaml {'.'.join(path)} has no schema (at {key})"
            node = props[key]
            while "$ref" in node:
                node = schema["definitions"][node["$ref"].rsplit("/", 1)[-1]]
        assert node.get("description") or node.get("type") or node.get("enum") or node.get("anyOf"), path


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"replicas": 2}, "/replicas"),
        ({"operatorReplicas": 1}, "additional properties 'operatorReplicas' not allowed"),
        ({"watchNamespaces": ["ML_team"]}, "/watchNamespaces/0"),
        ({"watchNamespaces": ["ml", "ml"]}, "/watchNamespaces"),
        ({"image": {"digest": "latest"}}, "/image/digest"),
        ({"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
        ({"securityContext": {"runAsUser": 0}}, "/securityContext/runAsUser"),
        ({"resources": {"limits": {"memory": "lots"}}}, "/resources/limits/memory"),
        ({"monitoring": {"routers": {"podMonitor": True, "port": "http"}}}, "/monitoring/routers"),
        ({"operator": {"metricsPort": 80}}, "/operator/metricsPort"),
    ],
)
def test_values_schema_rejects(values: dict[str, Any], message: str, tmp_path: Path) -> None:
    with pytest.raises(AssertionError) as err:
        render(tmp_path, values)
    assert message in str(err.value)


# ----- the operator Deployment ----------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_operator_pod_meets_restricted_pod_security(variant: str, tmp_path: Path) -> None:
    deployment = one(render(tmp_path, VARIANTS[variant]), "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert isinstance(pod["securityContext"]["runAsUser"], int) and pod["securityContext"]["runAsUser"] > 0
    assert not pod.get("hostNetwork") and not pod.get("hostPID") and not pod.get("hostIPC")
    for volume in pod["volumes"]:
        assert set(volume) - {"name"} <= {"emptyDir", "configMap", "secret", "projected"}, volume
    (container,) = pod["containers"]
    sc = container["securityContext"]
    assert sc["runAsNonRoot"] is True and sc["runAsUser"] == pod["securityContext"]["runAsUser"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False and sc["privileged"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}


def test_only_the_operator_pod_mounts_a_token(tmp_path: Path) -> None:
    objs = render(tmp_path)
    assert one(objs, "ServiceAccount")["automountServiceAccountToken"] is False
    pod = one(objs, "Deployment")["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is True
    assert pod["serviceAccountName"] == one(objs, "ServiceAccount")["metadata"]["name"]


@pytest.mark.parametrize("variant", ["default", "tuned"])
def test_probes_and_metrics_port_are_the_operator_flags(variant: str, tmp_path: Path) -> None:
    values = VARIANTS[variant] or {}
    ports = {**{"metricsPort": 8080, "healthPort": 8081}, **values.get("operator", {})}
    objs = render(tmp_path, values)
    (container,) = one(objs, "Deployment")["spec"]["template"]["spec"]["containers"]
    named = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert named == {"metrics": ports["metricsPort"], "health": ports["healthPort"]}
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "health"}
    args = container["args"]
    assert args[args.index("--metrics-port") + 1] == str(ports["metricsPort"])
    assert args[args.index("--health-port") + 1] == str(ports["healthPort"])
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
    service = one(objs, "Service")
    assert service["spec"]["ports"] == [
        {"name": "metrics", "port": ports["metricsPort"], "targetPort": "metrics", "protocol": "TCP"}
    ]


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_operator_args_run_the_real_cli(variant: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The rendered args through `duplex operator`'s own main(), up to the point where it would start kopf: every
    flag parses, and kopf gets the watched scope the values ask for."""
    values = VARIANTS[variant] or {}
    (container,) = one(render(tmp_path, values), "Deployment")["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["duplex", "operator"]
    started: dict[str, Any] = {}
    monkeypatch.setattr(operator_cli.kopf, "operator", lambda **kwargs: started.update(kwargs))
    monkeypatch.setattr(operator_cli.asyncio, "run", lambda _: None)
    monkeypatch.setattr(operator_cli, "start_http_server", lambda port: started.update(metrics_port=port))
    # main() sets these; monkeypatch puts back what was there.
    for name, value in (("DUPLEX_KUBECONFIG", ""), ("KUBECONFIG", ""), ("DUPLEX_RESYNC_SECONDS", "60")):
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("DUPLEX_WORKERS", raising=False)
    monkeypatch.delenv(POLICY_ENV, raising=False)
    assert operator_cli.main(container["args"]) == 0
    policy = values.get("policy", {})
    assert Policy.from_env() == Policy(
        policy.get("allowPrivilegedEFA", False),
        tuple(policy.get("allowedHostPathPrefixes", ())),
        tuple(policy.get("allowedImagePrefixes", ())),
        tuple(policy.get("allowedSecrets", ())),
        tuple(policy.get("allowedTolerationKeys", ())),
    )
    assert os.environ.get("DUPLEX_WORKERS") == (str(values["operator"]["workers"]) if "operator" in values else None)
    watched = values.get("watchNamespaces", [])
    assert started["clusterwide"] is (not watched) and started["namespaces"] == watched
    port = values.get("operator", {}).get("healthPort", 8081)
    assert started["liveness_endpoint"] == f"http://0.0.0.0:{port}/healthz"
    assert started["metrics_port"] == values.get("operator", {}).get("metricsPort", 8080)


def test_one_replica_at_most_and_never_two_during_an_upgrade(tmp_path: Path) -> None:
    deployment = one(render(tmp_path), "Deployment")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert schema["properties"]["replicas"]["maximum"] == 1


def test_disruption_budget_follows_the_replica_count(tmp_path: Path) -> None:
    pdb = one(render(tmp_path), "PodDisruptionBudget")
    deployment = one(render(tmp_path), "Deployment")
    assert pdb["spec"]["maxUnavailable"] == 1  # one replica: a drain may always move it
    assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    assert pdb["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    assert not by_kind(render(tmp_path, {"replicas": 0}), "PodDisruptionBudget")
    assert not by_kind(render(tmp_path, {"podDisruptionBudget": {"enabled": False}}), "PodDisruptionBudget")


# ----- RBAC: one rule list --------------------------------------------------------------------------------------


def test_cluster_mode_binds_the_one_rule_list_cluster_wide(tmp_path: Path) -> None:
    objs = render(tmp_path)
    role = one(objs, "ClusterRole")
    assert role["rules"] == rules()
    binding = one(objs, "ClusterRoleBinding")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": role["metadata"]["name"],
    }
    sa = one(objs, "ServiceAccount")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": "duplex-system"}
    ]
    (container,) = one(objs, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert "--all-namespaces" in container["args"] and "--namespace" not in container["args"]
    assert not by_kind(objs, "Role") and not by_kind(objs, "RoleBinding")


def test_namespaced_mode_renders_the_same_rules_into_each_watched_namespace(tmp_path: Path) -> None:
    objs = render(tmp_path, NAMESPACED)
    # Cluster-wide only the list's rules on cluster-scoped kinds, read-only: kopf's CRD and namespace discovery.
    cluster_role = one(objs, "ClusterRole")
    assert cluster_role["rules"] and all(rule in rules() for rule in cluster_role["rules"])
    scoped = {res for rule in cluster_role["rules"] for res in rule["resources"]}
    assert scoped == {"customresourcedefinitions", "namespaces"}
    assert {verb for rule in cluster_role["rules"] for verb in rule["verbs"]} <= {"get", "list", "watch"}
    assert one(objs, "ClusterRoleBinding")["roleRef"]["name"] == cluster_role["metadata"]["name"]
    roles = {r["metadata"]["namespace"]: r for r in by_kind(objs, "Role")}
    bindings = {b["metadata"]["namespace"]: b for b in by_kind(objs, "RoleBinding")}
    assert set(roles) == set(bindings) == {"ml-a", "ml-b"}
    sa = one(objs, "ServiceAccount")["metadata"]["name"]
    for ns, role in roles.items():
        assert role["rules"] == rules(), ns
        assert bindings[ns]["roleRef"]["kind"] == "Role" and bindings[ns]["roleRef"]["name"] == role["metadata"]["name"]
        assert bindings[ns]["subjects"] == [{"kind": "ServiceAccount", "name": sa, "namespace": "duplex-system"}]
    (container,) = one(objs, "Deployment")["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    assert [args[i + 1] for i, a in enumerate(args) if a == "--namespace"] == ["ml-a", "ml-b"]
    assert "--all-namespaces" not in args


def test_the_rule_list_lives_in_one_file_only() -> None:
    """Templates include files/clusterrole.yaml's rules; none types a rule of its own."""
    for template in (CHART / "templates").glob("*.yaml"):
        text = template.read_text()
        assert "apiGroups:" not in text and "verbs:" not in text, f"{template.name} types RBAC rules itself"
    assert yaml.safe_load(RULES_FILE.read_text())["kind"] == "ClusterRole"  # still kubectl-appliable as it is


def test_rbac_can_be_left_to_the_platform(tmp_path: Path) -> None:
    objs = render(tmp_path, {"rbac": {"create": False}, "serviceAccount": {"create": False, "name": "ops-duplex"}})
    assert not {"ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "ServiceAccount"} & {
        o["kind"] for o in objs
    }
    assert one(objs, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == "ops-duplex"


# ----- the CRD --------------------------------------------------------------------------------------------------


def test_chart_ships_the_generated_crd_unchanged() -> None:
    assert CRD_COPY.read_bytes() == CRD_SOURCE.read_bytes(), (
        "charts/duplex/files/crds/ differs from crds/: run `make crds` (it writes both), never edit either by hand"
    )


def test_crd_template_is_the_generated_crd_kept_on_uninstall(tmp_path: Path) -> None:
    crd = one(render(tmp_path), "CustomResourceDefinition")
    source = yaml.safe_load(CRD_SOURCE.read_text())
    assert crd["spec"] == source["spec"]
    assert crd["metadata"]["name"] == source["metadata"]["name"]
    assert crd["metadata"]["annotations"] == {
        "helm.sh/resource-policy": "keep",  # helm uninstall (and Flux's helm-controller, which runs Helm)
        "argocd.argoproj.io/sync-options": "Delete=false,Prune=false",  # Argo CD applies the rendered chart itself
    }
    assert source["metadata"]["labels"].items() <= crd["metadata"]["labels"].items()
    assert crd["metadata"]["labels"]["app.kubernetes.io/instance"] == "duplex"
    unkept = one(render(tmp_path, {"crds": {"install": True, "keep": False}}), "CustomResourceDefinition")
    assert "annotations" not in unkept["metadata"]
    assert not by_kind(render(tmp_path, {"crds": {"install": False, "keep": True}}), "CustomResourceDefinition")


# ----- monitoring -----------------------------------------------------------------------------------------------


def test_monitoring_objects_render_only_when_enabled(tmp_path: Path) -> None:
    default_kinds = {o["kind"] for o in render(tmp_path)}
    assert not MONITORING_KINDS & default_kinds and "ConfigMap" not in default_kinds
    toggles = {
        ("operator", "serviceMonitor"): ("ServiceMonitor", 1),
        ("routers", "podMonitor"): ("PodMonitor", 1),
        ("engines", "podMonitor"): ("PodMonitor", 1),
        ("prometheusRule", "enabled"): ("PrometheusRule", 1),
        ("grafanaDashboard", "enabled"): ("ConfigMap", 1),
    }
    for (section, key), (kind, count) in toggles.items():
        objs = render(tmp_path, {"monitoring": {section: {key: True}}})
        added = [o for o in objs if o["kind"] in MONITORING_KINDS | {"ConfigMap"}]
        assert [o["kind"] for o in added] == [kind] * count, (section, added)


def test_monitoring_objects_are_well_formed(tmp_path: Path) -> None:
    """Structural checks of prometheus-operator objects (their CRD schemas are not available offline)."""
    objs = render(tmp_path, ALL_MONITORING)
    for obj in by_kind(objs, "ServiceMonitor") + by_kind(objs, "PodMonitor") + by_kind(objs, "PrometheusRule"):
        assert obj["apiVersion"] == "monitoring.coreos.com/v1"
        assert obj["metadata"]["namespace"] == "duplex-system"
        assert obj["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    monitor = one(objs, "ServiceMonitor")
    assert set(monitor["spec"]) == {"selector", "namespaceSelector", "endpoints"}
    service = one(objs, "Service")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["duplex-system"]}
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint == {"port": "metrics", "path": "/metrics", "interval": "30s", "honorLabels": True}
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}


@pytest.mark.parametrize(
    ("variant", "selector"),
    [("monitoring", {"any": True}), ("namespaced-monitoring", {"matchNames": ["ml-a", "ml-b"]})],
)
def test_pod_monitors_select_the_pods_the_operator_creates(variant: str, selector: dict, tmp_path: Path) -> None:
    monitors = {m["metadata"]["name"]: m for m in by_kind(render(tmp_path, VARIANTS[variant]), "PodMonitor")}
    assert set(monitors) == {"duplex-routers", "duplex-engines"}
    roles = {"duplex-routers": ["router"], "duplex-engines": ["prefill", "decode"]}
    for name, monitor in monitors.items():
        spec = monitor["spec"]
        assert set(spec) == {"selector", "namespaceSelector", "podMetricsEndpoints"}
        assert spec["namespaceSelector"] == selector
        # The labels the operator's builders put on pods (duplex.children.labels), minus the version.
        for role in roles[name]:
            pod_labels = {k: v for k, v in child_labels("qwen", role).items() if k != "app.kubernetes.io/version"}
            assert spec["selector"]["matchLabels"].items() <= pod_labels.items(), (name, role)
        for other in {"router", "prefill", "decode"} - set(roles[name]):
            assert not spec["selector"]["matchLabels"].items() <= child_labels("qwen", other).items()
        (endpoint,) = spec["podMetricsEndpoints"]
        # The router's metrics name the engines: they are on its admin port, which its Service does not expose.
        assert endpoint["port"] == {"duplex-routers": "admin", "duplex-engines": "http"}[name]
        assert endpoint["path"] == "/metrics"
        targets = {r["targetLabel"]: r["sourceLabels"] for r in endpoint["relabelings"]}
        expected = {"serving": ["__meta_kubernetes_pod_label_duplex_dev_serving"]}
        if name == "duplex-engines":  # vLLM's metrics have no role; the router's own `role` (engine pool) is kept
            expected["role"] = ["__meta_kubernetes_pod_label_duplex_dev_role"]
        assert targets == expected
        assert endpoint["honorLabels"] is (name == "duplex-routers")


def test_prometheus_rule_ships_the_tested_rule_file(tmp_path: Path) -> None:
    rule = one(render(tmp_path, ALL_MONITORING), "PrometheusRule")
    assert rule["spec"] == yaml.safe_load((CHART / "files" / "prometheus-rules.yaml").read_text())


def test_store_bound_alert_uses_the_routers_own_bound() -> None:
    # The router exports its store's bound (store.max_bytes, which the operator renders as STORE_MEMORY_SHARE of the
    # router's memory), so the alert needs nothing from kube-state-metrics.
    text = (CHART / "files" / "prometheus-rules.yaml").read_text()
    assert "duplex_router_store_max_bytes" in text and "kube_pod_container_resource_limits" not in text
    assert 0 < STORE_MEMORY_SHARE < 1


def test_dashboard_config_map_for_the_grafana_sidecar(tmp_path: Path) -> None:
    cm = one(render(tmp_path, ALL_MONITORING), "ConfigMap")
    assert cm["metadata"]["namespace"] == "grafana"
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(cm["data"]["duplex.json"]) == json.loads((CHART / "files" / "grafana-dashboard.json").read_text())


# ----- docs/install.md stays true to the chart -------------------------------------------------------------------


def _install_doc_yaml() -> list[dict[str, Any]]:
    text = (ROOT / "docs" / "install.md").read_text()
    docs = []
    for block in re.findall(r"```yaml\n(.*?)```", text, flags=re.S):
        docs += [d for d in yaml.safe_load_all(block) if isinstance(d, dict)]
    return docs


def test_install_doc_ships_the_health_check_verbatim() -> None:
    (cm,) = [d for d in _install_doc_yaml() if d.get("kind") == "ConfigMap" and d["metadata"]["name"] == "argocd-cm"]
    lua = (CHART / "files" / "argocd-health.lua").read_text()
    assert cm["data"]["resource.customizations.health.duplex.dev_DisaggregatedServing"] == lua


def test_install_doc_values_are_values_the_chart_accepts(tmp_path: Path) -> None:
    """The values file, the Argo CD Application's valuesObject and the Flux HelmRelease's values all render."""
    text = (ROOT / "docs" / "install.md").read_text()
    (values_block,) = [
        b for b in re.findall(r"```yaml\n(.*?)```", text, flags=re.S) if b.startswith("# duplex-values.yaml")
    ]
    candidates = [yaml.safe_load(values_block)]
    for doc in _install_doc_yaml():
        if doc.get("kind") == "Application" and doc["spec"]["source"].get("path") == "charts/duplex":
            candidates.append(doc["spec"]["source"]["helm"]["valuesObject"])
        if doc.get("kind") == "HelmRelease":
            assert doc["spec"]["chart"]["spec"]["chart"] == "./charts/duplex"
            candidates.append(doc["spec"]["values"])
    assert len(candidates) == 3
    for values in candidates:
        kinds = {o["kind"] for o in tooling.render(tmp_path, values)}
        assert {"Deployment", "PrometheusRule", "ServiceMonitor", "PodMonitor"} <= kinds

"""The operator's metrics as the chart exposes them: `duplex operator` run with the rendered Deployment's args under
the chart's ServiceAccount, scraped on the port the metrics Service (and so the ServiceMonitor) targets; every
operator metric the alerts and dashboard query is there, with the labels they use."""

from __future__ import annotations

import sys
import uuid

import pytest
import yaml
from operator_harness import ROOT, free_port

sys.path.insert(0, str(ROOT / "tests" / "observability"))

from chart_release import ChartOperator, Helm, adopt_crd, operator_container, restore_generated_crd
from exporters import scrape
from promql import TARGET_LABELS, all_queries, label_names, metric_names

pytestmark = pytest.mark.cluster

OPERATOR_PREFIXES = ("duplex_reconcile", "duplex_api_", "duplex_managed_", "duplex_servings")


def test_operator_exports_what_the_alerts_and_dashboard_query(cluster, kubectl, namespace, wait_for, tmp_path):
    release, release_ns = "duplex-mon", f"duplex-mon-{uuid.uuid4().hex[:6]}"
    helm = Helm(cluster.kubeconfig, tmp_path / "helm")
    kubectl("create", "namespace", release_ns)
    adopt_crd(kubectl, release, release_ns)
    operator: ChartOperator | None = None
    try:
        helm.install(
            release,
            release_ns,
            {"operator": {"metricsPort": free_port(), "healthPort": free_port(), "resyncSeconds": 2}},
        )
        service = kubectl.json("-n", release_ns, "get", "service", f"{release}-metrics")
        container = operator_container(kubectl, release_ns, release)
        (port,) = service["spec"]["ports"]
        assert port["targetPort"] in {p["name"] for p in container["ports"]}
        identity = cluster.kubeconfig_for_serviceaccount(release_ns, release)
        operator = ChartOperator(container, identity, tmp_path / "operator.log").start()
        assert operator.metrics_url.endswith(f":{port['port']}/metrics")

        doc = yaml.safe_load((ROOT / "examples" / "seed.yaml").read_text())
        doc["metadata"]["namespace"] = namespace
        kubectl.apply(doc)
        kubectl("-n", namespace, "wait", "--for=condition=Ready", "dsv/qwen3-32b", "--timeout=180s", timeout=240)
        wait_for(lambda: operator.metric("duplex_reconciles_total", result="ok") >= 2, timeout=30, what="resyncs")

        exported = scrape(operator.metrics_url)
        for query in all_queries():
            names = {n for n in metric_names(query.expr) if n.startswith(OPERATOR_PREFIXES)}
            missing = names - set(exported)
            assert not missing, f"{query.where} queries {sorted(missing)}, which `duplex operator` does not export"
            sampled = [exported[n] for n in names if exported[n].sampled]
            if names and len(sampled) == len(names):
                offered = set().union(*(f.labels for f in sampled))
                extra = label_names(query.expr) - TARGET_LABELS - offered
                assert not extra, f"{query.where}: {sorted(extra)} not among {sorted(offered)}"
        # The ServiceMonitor's honorLabels keeps these (the serving's namespace, not the operator pod's).
        assert exported["duplex_managed_objects"].labels >= {"namespace", "serving", "kind"}
        kubectl("-n", namespace, "delete", "dsv", "qwen3-32b", "--wait=true", "--timeout=120s", timeout=180)
    finally:
        if operator is not None:
            print(f"----- operator log ({operator.log_path}) -----\n{operator.log_tail()}")
            operator.stop()
        helm("uninstall", release, "-n", release_ns, "--wait", "--ignore-not-found", check=False)
        kubectl("delete", "namespace", release_ns, "--wait=false", "--ignore-not-found")
        restore_generated_crd(kubectl)

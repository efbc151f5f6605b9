"""The router's fabric report on the real API server, under an identity that may patch one ConfigMap and nothing
else (what the operator grants the router): the verdict lands under the pod's key, a flip is written at once,
other keys are left alone, and any other ConfigMap is out of reach."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from duplex_sidecars.router.config import FabricReportConfig
from duplex_sidecars.router.endpointslices import ApiAccess
from duplex_sidecars.router.fabric_report import FabricReporter

pytestmark = pytest.mark.cluster


def router_identity(kubectl, namespace: str, config_map: str, tmp_path: Path) -> Path:
    """A ServiceAccount whose Role may patch `config_map` only, and a kubeconfig with its token."""
    kubectl.apply(
        [
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "router"}},
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "Role",
                "metadata": {"name": "router"},
                "rules": [
                    {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": [config_map], "verbs": ["patch"]}
                ],
            },
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": {"name": "router"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "router"},
                "subjects": [{"kind": "ServiceAccount", "name": "router", "namespace": namespace}],
            },
        ],
        namespace,
    )
    return kubectl.service_account_kubeconfig(namespace, "router", tmp_path / "router.kubeconfig")


def reports(kubectl, namespace: str, name: str) -> dict[str, dict]:
    data = kubectl.json("-n", namespace, "get", "configmap", name).get("data") or {}
    return {k: json.loads(v) for k, v in data.items() if k != "other"}


async def test_the_router_reports_its_fabric_verdict_into_its_one_configmap(kubectl, namespace, tmp_path, monkeypatch):
    kubectl("-n", namespace, "create", "configmap", "qwen-fabric", "--from-literal=other=kept")
    kubectl("-n", namespace, "create", "configmap", "unrelated")
    kubeconfig = router_identity(kubectl, namespace, "qwen-fabric", tmp_path)
    monkeypatch.setenv("POD_NAME", "qwen-router-abc")
    verdict = [True, "KV transfers at 2.10-2.40 GB/s (LIBFABRIC)"]
    config = FabricReportConfig(
        namespace=namespace,
        config_map="qwen-fabric",
        kubeconfig=str(kubeconfig),
        heartbeat_seconds=600,
        load_seconds=0.3,
    )
    load: list[dict | None] = [None]
    reporter = FabricReporter(
        config,
        lambda: {
            "healthy": verdict[0],
            "measured": True,
            "message": verdict[1],
            "backend": "LIBFABRIC",
            "load": load[0],
        },
        check_every=0.1,
    )
    await reporter.start()
    try:

        async def until(predicate, what: str) -> None:
            for _ in range(300):
                if predicate():
                    return
                await asyncio.sleep(0.1)
            raise AssertionError(f"timed out waiting for {what}")

        await until(lambda: reporter.writes == 1, "the first report")
        first = reports(kubectl, namespace, "qwen-fabric")["qwen-router-abc"]
        assert (
            first["healthy"] is True
            and first["measured"] is True
            and first["backend"] == "LIBFABRIC"
            and first["at"].endswith("Z")
        )

        verdict[:] = [False, "KV transfers at 0.30 GB/s on prefill http://10.0.0.1:8000: TCP fallback?"]
        await until(lambda: reporter.writes == 2, "the flip to be written")
        now = reports(kubectl, namespace, "qwen-fabric")["qwen-router-abc"]
        assert now["healthy"] is False and "TCP fallback" in now["message"]
        await asyncio.sleep(0.5)
        assert reporter.writes == 2, "an unchanged verdict is written again only at the heartbeat"
        data = kubectl.json("-n", namespace, "get", "configmap", "qwen-fabric")["data"]
        assert data["other"] == "kept"

        # Under traffic the load goes out every load_seconds (the planner's input), and once more when it ends.
        load[0] = {"seconds": 60, "decode": {"saturation": 0.9, "peak": 1.2}, "turns": 12, "ttft_p90": 0.4}
        await until(lambda: reporter.writes >= 4, "load reports while busy")
        assert reports(kubectl, namespace, "qwen-fabric")["qwen-router-abc"]["load"]["turns"] == 12
        load[0] = {"seconds": 60, "turns": 0, "ttft_p90": None}
        await until(lambda: not reporter.reported_busy, "the report that says the traffic ended")
        idle = reporter.writes
        await asyncio.sleep(1.0)
        assert reporter.writes == idle, "an idle router writes again only at the heartbeat"
    finally:
        await reporter.stop()

    # The same identity cannot touch any other ConfigMap.
    other = FabricReportConfig(namespace=namespace, config_map="unrelated", kubeconfig=str(kubeconfig))
    outsider = FabricReporter(
        other,
        lambda: {"healthy": True, "measured": False, "message": "", "backend": "UCX"},
        check_every=60,
        access=ApiAccess.from_kubeconfig(str(kubeconfig)),
    )
    await outsider.start()
    try:
        assert await outsider.publish() is False and outsider.failing
    finally:
        await outsider.stop()
    assert not (kubectl.json("-n", namespace, "get", "configmap", "unrelated").get("data") or {})

"""Fixtures of the e2e tier: a local cluster of its own with a real node (containerd, runc, kubelet, kube-proxy), the
duplex image `make image` built imported into the node, duplex installed with its Helm chart (the operator as a pod)
and examples/local.yaml serving from pods that really run. Everything here is what a user deploys; nothing is
started beside the cluster but the test's own HTTP client.

A missing binary, image or privilege is a failure, never a skip."""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from duplex_dev import images, processes
from duplex_dev.cluster import ClusterError, LocalCluster, tools
from duplex_dev.cluster.node_config import CHART_NODE_SELECTOR, NODE_NAME, node_name

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
RELEASE, RELEASE_NAMESPACE = "duplex", "duplex-system"
NAMESPACE = "e2e"
SERVING = "local"
ROLE_LABEL, SERVING_LABEL = "duplex.dev/role", "duplex.dev/serving"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "e2e: a local cluster with a real node; duplex installed by its chart")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if Path(str(item.fspath)).is_relative_to(HERE):
            item.add_marker(pytest.mark.e2e)


_STATE_DIRS: list[Path] = []  # the e2e cluster's state dir, once it is up


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """A failed test carries the tails of the pods' logs (kept beside the cluster's logs, outliving the pods) and of
    the node's daemons."""
    report = yield
    if report.failed and _STATE_DIRS and Path(str(item.fspath)).is_relative_to(HERE):
        logs = _STATE_DIRS[-1] / "logs"
        for path in sorted(logs.glob("pods/*/*/*.log")) + [logs / f"{n}.log" for n in ("kubelet", "containerd")]:
            if path.is_file():
                name = str(path.relative_to(logs))
                report.sections.append((f"log tail: {name}", processes.log_tail(path, 30)))
    return report


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.5) -> Any:
    """Poll until `predicate` returns something truthy (returned); fail naming `what` and the last value."""
    deadline = time.monotonic() + timeout
    while True:
        last = predicate()
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")
        time.sleep(interval)


@dataclass
class Cluster:
    """The e2e cluster, with kubectl and helm bound to it."""

    local: LocalCluster

    def kubectl(self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120) -> str:
        argv = [str(self.local.kubectl), f"--kubeconfig={self.local.kubeconfig}", *args]
        proc = subprocess.run(argv, input=input, capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} exited {proc.returncode}: {proc.stderr.strip()}")
        return proc.stdout

    def json(self, *args: str) -> Any:
        return json.loads(self.kubectl(*args, "-o", "json"))

    def helm(self, *args: str, timeout: float = 400) -> str:
        argv = [str(self.local.bin_dir / "helm"), f"--kubeconfig={self.local.kubeconfig}", *args]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        assert proc.returncode == 0, f"helm {' '.join(args)}: {proc.stderr.strip() or proc.stdout.strip()}"
        return proc.stdout

    def pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        return list(self.json("-n", namespace, "get", "pods", "-l", selector)["items"])

    def running(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        """Pods that run and are ready, and are not being deleted."""
        out = []
        for pod in self.pods(namespace, selector):
            conds = {c["type"]: c["status"] for c in pod["status"].get("conditions", [])}
            deleting = pod["metadata"].get("deletionTimestamp")
            if pod["status"].get("phase") == "Running" and conds.get("Ready") == "True" and not deleting:
                out.append(pod)
        return out

    def condition(self, kind: str, serving: str = SERVING, namespace: str = NAMESPACE) -> dict[str, Any]:
        obj = self.json("-n", namespace, "get", "dsv", serving)
        conds = {c["type"]: c for c in (obj.get("status") or {}).get("conditions") or []}
        return dict(conds.get(kind) or {})

    def wait_condition(self, kind: str, timeout: float, serving: str = SERVING, namespace: str = NAMESPACE) -> None:
        """Until the serving's condition `kind` is True; a timeout shows the condition as it last was."""
        last: dict[str, Any] = {}

        def true() -> bool:
            nonlocal last
            last = self.condition(kind, serving, namespace)
            return last.get("status") == "True"

        try:
            wait_for(true, timeout, f"{kind} True")
        except AssertionError as err:
            raise AssertionError(f"{err}; {kind} was {last}") from None

    def serves_through(self, service: str, pods: list[dict[str, Any]], namespace: str = NAMESPACE) -> bool:
        """Whether the Service's EndpointSlices list exactly these pods, ready, and kube-proxy's rules on the node
        send new connections to them only: a pod Ready is not yet in the slice, and a slice changed is not yet in
        the rules (each lags behind the one before)."""
        slices = self.json("-n", namespace, "get", "endpointslices", "-l", f"kubernetes.io/service-name={service}")
        listed = {
            address
            for s in slices["items"]
            for e in s.get("endpoints") or []
            if (e.get("conditions") or {}).get("ready")
            for address in e.get("addresses") or []
        }
        everything = {a for s in slices["items"] for e in s.get("endpoints") or [] for a in e.get("addresses") or []}
        wanted = {p["status"]["podIP"] for p in pods}
        if not wanted or not listed == wanted == everything:
            return False
        node = self.local.node
        assert node is not None, "the e2e cluster runs a real node"
        return node.proxied_to(namespace, service) == wanted

    def service_url(self, name: str, namespace: str = NAMESPACE) -> str:
        svc = self.json("-n", namespace, "get", "svc", name)
        return f"http://{svc['spec']['clusterIP']}:{svc['spec']['ports'][0]['port']}"

    def metric(self, pod: dict[str, Any], port: int, name: str, **labels: str) -> float:
        samples = processes.scrape(f"http://{pod['status']['podIP']}:{port}/metrics", timeout=10)
        return processes.metric_sum(samples, name, **labels)


@pytest.fixture(scope="session")
def node_cluster(image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """The cluster, its two real nodes Ready and the project's images imported into both. The second node,
    duplex-node-b, starts cordoned: the tier's children land on duplex-node as with one node (test_serving asserts
    it), and a test that needs a node to move pods to (test_node_drain) uncordons it and leaves it as it found it."""
    if os.geteuid() != 0:
        pytest.fail("the e2e tier runs a real kubelet node: it needs root (namespaces, cgroups, mounts)", pytrace=False)
    try:
        bin_dir = tools.locate(None)
        tools.node_binaries(bin_dir)
    except tools.ToolsMissing as err:
        pytest.fail(f"{err}. The e2e tier is never skipped.", pytrace=False)
    local = LocalCluster(tmp_path_factory.mktemp("e2e-cluster"), bin_dir=bin_dir, real_nodes=2)
    _STATE_DIRS.append(local.state_dir)
    try:
        local.up(timeout=300)
        local.import_image(images.archive(image))
        local.import_image(images.archive(images.redis_image()))
    except (ClusterError, images.ImageMissing) as err:
        local.down()
        pytest.fail(f"the e2e cluster did not start: {err}", pytrace=False)
    try:
        cluster = Cluster(local)
        cluster.kubectl("cordon", node_name(1))
        yield cluster
    finally:
        local.down()  # raises when anything of the node is left behind (test_cluster_down checks it too)


@pytest.fixture(scope="session")
def installed(node_cluster: Cluster) -> Cluster:
    """duplex installed by its chart, the operator pod Ready on the real node."""
    node_cluster.helm(
        "upgrade", "--install", RELEASE, str(ROOT / "charts/duplex"), "-n", RELEASE_NAMESPACE, "--create-namespace",
        "--wait", "--timeout", "5m",
        "--set-string", CHART_NODE_SELECTOR,
    )  # fmt: skip
    return node_cluster


def local_example(**env: str) -> dict[str, Any]:
    """examples/local.yaml with extra engine environment, and prefill without a prefix cache of its own: in 1P1D it
    would hold the previous prompt already, and read from decode only what lies past it (as the demo runs it)."""
    doc = yaml.safe_load((ROOT / "examples/local.yaml").read_text())
    model = doc["spec"]["model"]
    model["env"] = [*model.get("env", []), *({"name": k, "value": v} for k, v in env.items())]
    doc["spec"]["prefill"]["enablePrefixCaching"] = False
    return dict(doc)


@pytest.fixture(scope="session")
def serving(installed: Cluster) -> Cluster:
    """examples/local.yaml in its namespace, Ready, its canary verified by the router pod on the engine pods. The
    simulator fails any request whose blocks it finds corrupt, so that a wrong reuse cannot pass unnoticed."""
    installed.kubectl("create", "namespace", NAMESPACE)
    doc = local_example(DUPLEX_SIM_ARGS="--fail-on-corrupt")
    # A decode pod going away waits for bindings stored in the last 30 s, not 120: the tests' conversations turn
    # within seconds, and an earlier test's last binding then holds a scale-in's pod half a minute, not two.
    doc["spec"]["decode"]["drain"] = {"activeSeconds": 30}
    installed.kubectl("-n", NAMESPACE, "apply", "-f", "-", input=yaml.safe_dump(doc))
    wait_for(lambda: installed.condition("Ready").get("status") == "True", 300, "the serving Ready")
    wait_for(
        lambda: installed.condition("DisaggregationVerified").get("status") == "True",
        300,
        "DisaggregationVerified (the router pod's canary on the engine pods)",
    )
    return installed


def conversation_id() -> str:
    return f"e2e-{uuid.uuid4().hex[:12]}"


__all__ = ["NAMESPACE", "NODE_NAME", "ROLE_LABEL", "SERVING", "SERVING_LABEL", "Cluster", "conversation_id", "wait_for"]

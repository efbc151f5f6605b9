"""The chart on the local control plane: `helm` bound to the cluster, and the operator run under the identity the
chart created. kwok runs no containers, so the operator's pod never runs; instead `duplex operator` runs here with
exactly the rendered Deployment's command and args and a token of the chart's ServiceAccount (TokenRequest API)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml
from tooling import CHART, helm, run

from duplex_dev import processes

CRD_NAME = "disaggregatedservings.duplex.dev"
CRD_FILE = Path(__file__).resolve().parents[2] / "crds" / "duplex.dev_disaggregatedservings.yaml"


class Helm:
    """The helm binary against one kubeconfig, with its own config, cache and data dirs."""

    def __init__(self, kubeconfig: Path, home: Path) -> None:
        self.kubeconfig = kubeconfig
        home.mkdir(parents=True, exist_ok=True)
        self.env = {
            **os.environ,
            "HELM_CONFIG_HOME": str(home / "config"),
            "HELM_CACHE_HOME": str(home / "cache"),
            "HELM_DATA_HOME": str(home / "data"),
        }

    def __call__(self, *args: str | Path, check: bool = True) -> subprocess.CompletedProcess[str]:
        return run([helm(), f"--kubeconfig={self.kubeconfig}", *args], check=check, env=self.env)

    def install(self, release: str, namespace: str, values: dict[str, Any], chart: Path = CHART, *extra: str) -> str:
        return self._deploy("install", release, namespace, values, chart, *extra)

    def upgrade(self, release: str, namespace: str, values: dict[str, Any], chart: Path = CHART, *extra: str) -> str:
        return self._deploy("upgrade", release, namespace, values, chart, *extra)

    def _deploy(self, verb: str, release: str, namespace: str, values: dict[str, Any], chart: Path, *extra: str) -> str:
        values_file = Path(self.env["HELM_CONFIG_HOME"]).parent / f"values-{release}-{time.monotonic_ns()}.yaml"
        values_file.write_text(yaml.safe_dump(values))
        argv = [verb, release, chart, "-n", namespace, "-f", values_file, "--wait", "--timeout", "180s", *extra]
        return self(*argv).stdout

    def manifest(self, release: str, namespace: str) -> list[dict[str, Any]]:
        out = self("get", "manifest", release, "-n", namespace).stdout
        return [d for d in yaml.safe_load_all(out) if d]

    def revisions(self, release: str, namespace: str) -> list[dict[str, Any]]:
        return yaml.safe_load(self("history", release, "-n", namespace, "-o", "yaml").stdout)


def adopt_crd(kubectl: Any, release: str, namespace: str) -> None:
    """Hand an existing CRD (applied with kubectl, or kept from an uninstalled release) to `release`, the way
    docs/install.md tells a user to: Helm adopts an object whose ownership metadata names the release."""
    try:
        kubectl("get", "crd", CRD_NAME)
    except AssertionError:
        return
    kubectl(
        "annotate", "crd", CRD_NAME, "--overwrite",
        f"meta.helm.sh/release-name={release}", f"meta.helm.sh/release-namespace={namespace}",
    )  # fmt: skip
    kubectl("label", "crd", CRD_NAME, "--overwrite", "app.kubernetes.io/managed-by=Helm")


def restore_generated_crd(kubectl: Any) -> None:
    """Back to the generated CRD (whatever a test's chart did to the schema), for the tests after it."""
    kubectl("apply", "--server-side", "--force-conflicts", "--field-manager=duplex-tests", "-f", str(CRD_FILE))
    kubectl("wait", "--for=condition=Established", f"crd/{CRD_NAME}", "--timeout=60s")


def operator_container(kubectl: Any, namespace: str, deployment: str) -> dict[str, Any]:
    obj = kubectl.json("-n", namespace, "get", "deployment", deployment)
    (container,) = obj["spec"]["template"]["spec"]["containers"]
    return container


class ChartOperator:
    """`duplex operator` with the Deployment's command and args, authenticated as its ServiceAccount."""

    def __init__(self, container: dict[str, Any], kubeconfig: Path, log_path: Path) -> None:
        assert container["command"][0] == "duplex", container["command"]
        self.argv = [sys.executable, "-m", "duplex.cli", *container["command"][1:], *container["args"]]
        # Through $KUBECONFIG, the client's own discovery (as in a pod, where in-cluster config is found the same
        # way), not --kubeconfig: the operator's login handler drops a kubeconfig's bearer token (it reads
        # api_key["authorization"]; kubernetes>=36 keeps it under "BearerToken") and would connect anonymously.
        self.kubeconfig = kubeconfig
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        self.metrics_url = f"http://127.0.0.1:{ports['metrics']}/metrics"
        probe = container["readinessProbe"]["httpGet"]
        assert container["livenessProbe"]["httpGet"] == probe
        self.health_url = f"http://127.0.0.1:{ports[probe['port']]}{probe['path']}"
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 120.0) -> ChartOperator:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "KUBECONFIG": str(self.kubeconfig)}
        env.pop("DUPLEX_KUBECONFIG", None)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + timeout
        while not self.healthy():  # what the Deployment's liveness and readiness probes ask
            if self.proc.poll() is not None:
                raise AssertionError(f"duplex operator exited {self.proc.returncode}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"duplex operator not healthy at {self.health_url}:\n{self.log_tail()}")
            time.sleep(0.5)
        return self

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.health_url, timeout=2) as resp:
                return resp.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def stop(self) -> None:
        processes.stop_child(self.proc, 20)
        self.proc = None

    def metric(self, name: str, **labels: str) -> float:
        return processes.metric_sum(processes.scrape(self.metrics_url), name, **labels)

    def log_tail(self, lines: int = 60) -> str:
        return processes.log_tail(self.log_path, lines)

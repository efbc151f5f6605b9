"""metrics-server as a host process beside a local cluster, so that `kubectl top` and a CPU-based
HorizontalPodAutoscaler work there: the resource metrics API (metrics.k8s.io) served on loopback and registered with
the apiserver's aggregation layer through an APIService whose Service is an ExternalName for `localhost` (the
apiserver runs on the host too; a ClusterIP would lead into the node's network namespace). It scrapes the real
node's kubelet as the cluster's admin. The binary is built by hack/build-tools.sh (`DUPLEX_TOOLS=metrics`).

    with MetricsServer(cluster) as ms:    # returns once `kubectl get --raw /apis/metrics.k8s.io/v1beta1/pods` works
        ...
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from duplex_dev import processes
from duplex_dev.cluster import LocalCluster
from duplex_dev.processes import LaunchError, free_port
from duplex_dev.versions import built_tool, cache_dir, version

BUILD_HINT = "run `DUPLEX_TOOLS=metrics bash hack/build-tools.sh`"
NAMESPACE = "kube-system"
NAME = "metrics-server"
GROUP_VERSION = "v1beta1.metrics.k8s.io"
RESOLUTION_SECONDS = 15  # its default (above its 10 s kubelet timeout); the HPA controller looks every 15 s too


class MetricsServerMissing(LaunchError):
    pass


def metrics_server_binary() -> Path:
    path = built_tool("metrics-server", "METRICS_SERVER_VERSION")
    if path is None:
        pinned = version("METRICS_SERVER_VERSION")
        raise MetricsServerMissing(f"metrics-server {pinned} is missing in {cache_dir()}: {BUILD_HINT}")
    return path


def registration(port: int) -> list[dict[str, Any]]:
    """The Service and APIService that route metrics.k8s.io to localhost:`port` (self-signed: TLS is not verified,
    as the upstream manifests' `--kubelet-insecure-tls` set-ups do)."""
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": NAME, "namespace": NAMESPACE},
        "spec": {"type": "ExternalName", "externalName": "localhost"},
    }
    api_service = {
        "apiVersion": "apiregistration.k8s.io/v1",
        "kind": "APIService",
        "metadata": {"name": GROUP_VERSION},
        "spec": {
            "group": "metrics.k8s.io",
            "version": "v1beta1",
            "service": {"name": NAME, "namespace": NAMESPACE, "port": port},
            "insecureSkipTLSVerify": True,
            "groupPriorityMinimum": 100,
            "versionPriority": 100,
        },
    }
    return [service, api_service]


class MetricsServer:
    def __init__(self, cluster: LocalCluster, binary: Path | None = None, startup_timeout: float = 120.0):
        self.cluster = cluster
        self.binary = binary or metrics_server_binary()
        self.port = free_port("127.0.0.1")
        self.startup_timeout = startup_timeout
        self.dir = tempfile.mkdtemp(prefix="duplex-metrics-server-")
        self.log_path = os.path.join(self.dir, "metrics-server.log")
        self.process: subprocess.Popen[bytes] | None = None

    def _kubectl(self, *args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        argv = [str(self.cluster.kubectl), f"--kubeconfig={self.cluster.kubeconfig}", *args]
        proc = subprocess.run(argv, input=input, capture_output=True, text=True, timeout=60)
        if check and proc.returncode != 0:
            raise LaunchError(f"kubectl {' '.join(args)}: {proc.stderr.strip()}")
        return proc

    def start(self) -> MetricsServer:
        kubeconfig = str(self.cluster.kubeconfig)
        argv = [
            str(self.binary),
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--secure-port={self.port}",
            f"--cert-dir={self.dir}",
            "--kubelet-insecure-tls",
            "--kubelet-preferred-address-types=InternalIP",
            f"--metric-resolution={RESOLUTION_SECONDS}s",
        ]
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        docs = "".join("---\n" + json.dumps(doc) + "\n" for doc in registration(self.port))
        try:
            self._kubectl("apply", "-f", "-", input=docs)
            startup = processes.Startup(
                f"metrics-server on 127.0.0.1:{self.port} (metrics.k8s.io through the apiserver)",
                self._serving,
                self.process.poll,
                self.log_path,
                self.startup_timeout,
            )
            startup.wait(interval=1.0)
        except LaunchError:
            self.stop()
            raise
        return self

    def _serving(self) -> bool:
        """True once the apiserver routes to it and it has a first scrape of the node."""
        proc = self._kubectl("get", "--raw", "/apis/metrics.k8s.io/v1beta1/nodes", check=False)
        return proc.returncode == 0 and bool(json.loads(proc.stdout or "{}").get("items"))

    def pod_cpu(self, namespace: str, selector: str) -> dict[str, float]:
        """CPU cores per pod as metrics.k8s.io has them now (the HPA's input)."""
        proc = self._kubectl(
            "get", "--raw", f"/apis/metrics.k8s.io/v1beta1/namespaces/{namespace}/pods?labelSelector={selector}"
        )
        out = {}
        for item in json.loads(proc.stdout).get("items", []):
            out[item["metadata"]["name"]] = sum(_cores(c["usage"]["cpu"]) for c in item["containers"])
        return out

    def log_tail(self, lines: int = 40) -> str:
        return processes.log_tail(self.log_path, lines)

    def stop(self) -> int | None:
        """Unregister (when the apiserver is still up), stop; the directory goes unless it did not exit cleanly."""
        self._kubectl("delete", "apiservice", GROUP_VERSION, "--ignore-not-found", "--wait=false", check=False)
        self._kubectl("-n", NAMESPACE, "delete", "service", NAME, "--ignore-not-found", "--wait=false", check=False)
        code = processes.stop_child(self.process, timeout=10)
        if code == 0:
            shutil.rmtree(self.dir, ignore_errors=True)
        return code

    def __enter__(self) -> MetricsServer:
        return self.start()

    def __exit__(self, *_: Any) -> None:
        self.stop()


def _cores(quantity: str) -> float:
    """A CPU quantity as metrics.k8s.io writes it (`12345n`, `5m`, `1`) in cores."""
    for suffix, scale in (("n", 1e-9), ("u", 1e-6), ("m", 1e-3)):
        if quantity.endswith(suffix):
            return float(quantity[: -len(suffix)]) * scale
    return float(quantity)

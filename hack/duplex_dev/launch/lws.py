"""The LeaderWorkerSet controller (sigs.k8s.io/lws) as a host process beside a local cluster, so that a
LeaderWorkerSet applied there gets its groups: the leader StatefulSet, one worker StatefulSet per group, their pods.

Its admission webhooks are served, not switched off (ENABLE_WEBHOOKS=false would): the LeaderWorkerSet defaulter
fills in what the controller reads unchecked (restartPolicy, the rolling update's maxUnavailable and partition, the
subdomain policy) and the pod defaulter puts on the labels the controller finds a group's pods by (group index,
worker index, group key) and the LWS_* environment. The webhook server listens on loopback with a self-signed cert;
the webhook configurations the release ships are registered with `clientConfig.url` and that cert as caBundle, as
the apiserver runs on the host too. The release's cert rotation (which wants a Service and a Secret in the cluster),
leader election and the metrics server are off. The binary, CRDs and webhook configurations are built and copied
by hack/build-tools.sh (`DUPLEX_TOOLS=lws`).

    with LWSController(cluster) as lws:    # returns once the apiserver admits a LeaderWorkerSet through the webhooks
        ...

Stopping unregisters the webhooks and leaves the CRDs (and any LeaderWorkerSet) in place; uninstall_crds() removes
them.
"""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from duplex_dev import processes
from duplex_dev.cluster import LocalCluster
from duplex_dev.launch.operator import wait_established
from duplex_dev.processes import LaunchError, free_port
from duplex_dev.versions import built_tool, cache_dir, version

BUILD_HINT = "run `DUPLEX_TOOLS=lws bash hack/build-tools.sh`"
HOST = "127.0.0.1"
# The release's configuration names, prefixed so they cannot be mistaken for an in-cluster installation's.
CONFIGURATION_PREFIX = "duplex-lws-"
# What the release's kustomize patch (config/webhook/{mutating,validating}-patch.yaml) adds to its pod webhooks: only
# pods of a LeaderWorkerSet go through them, so no other pod's creation depends on this process.
LWS_POD_SELECTOR = {"matchExpressions": [{"key": "leaderworkerset.sigs.k8s.io/name", "operator": "Exists"}]}
# Admitted with a server-side dry run to tell that the webhooks answer; never stored.
PROBE = {
    "apiVersion": "leaderworkerset.x-k8s.io/v1",
    "kind": "LeaderWorkerSet",
    "metadata": {"name": "duplex-lws-probe", "namespace": "default"},
    "spec": {
        "replicas": 1,
        "leaderWorkerTemplate": {
            "size": 1,
            "workerTemplate": {"spec": {"containers": [{"name": "probe", "image": "probe"}]}},
        },
    },
}


class LWSMissing(LaunchError):
    pass


def lws_dir() -> Path:
    """The cache directory holding the pinned release's `lws` binary, `crds.yaml` and `webhooks.yaml`."""
    binary = built_tool("lws", "LWS_VERSION")
    if binary is None or not (binary.parent / "crds.yaml").is_file() or not (binary.parent / "webhooks.yaml").is_file():
        raise LWSMissing(f"lws {version('LWS_VERSION')} is missing in {cache_dir()}: {BUILD_HINT}")
    return binary.parent


def serving_cert(host: str = HOST) -> tuple[bytes, bytes]:
    """A self-signed serving cert (PEM) for `host` and its key: the webhook server's cert and, as the only cert the
    apiserver has to trust, the webhook configurations' caBundle."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"duplex-lws-webhook@{host}")])
    now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)  # valid to a clock that reads a little earlier
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + dt.timedelta(days=365))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(host))]), critical=False)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


def webhook_configurations(released: list[dict[str, Any]], url: str, ca_pem: bytes) -> list[dict[str, Any]]:
    """The release's Mutating/ValidatingWebhookConfigurations (config/webhook/manifests.yaml) pointed at `url` (the
    webhook server, e.g. https://127.0.0.1:PORT) instead of its in-cluster Service, with the pod selector its
    kustomize patch adds."""
    ca_bundle = base64.b64encode(ca_pem).decode()
    out = []
    for doc in released:
        doc = json.loads(json.dumps(doc))  # a deep copy, the caller's list stays as released
        doc["metadata"] = {"name": CONFIGURATION_PREFIX + doc["metadata"]["name"]}
        for hook in doc["webhooks"]:
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": url + path, "caBundle": ca_bundle}
            if any("pods" in rule["resources"] for rule in hook["rules"]):
                hook["objectSelector"] = LWS_POD_SELECTOR
        out.append(doc)
    return out


def controller_config(webhook_port: int, probe_port: int, cert_dir: Path) -> dict[str, Any]:
    """The controller's Configuration (config.lws.x-k8s.io/v1alpha1): webhooks and probes on loopback with our cert,
    no cert rotation, no leader election, no metrics server ("0" turns controller-runtime's off)."""
    return {
        "apiVersion": "config.lws.x-k8s.io/v1alpha1",
        "kind": "Configuration",
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "webhook": {"host": HOST, "port": webhook_port, "certDir": str(cert_dir)},
        "metrics": {"bindAddress": "0"},
        "health": {"healthProbeBindAddress": f"{HOST}:{probe_port}"},
    }


class LWSController:
    def __init__(self, cluster: LocalCluster, directory: Path | None = None, startup_timeout: float = 120.0):
        self.cluster = cluster
        self.release = directory or lws_dir()
        self.webhook_port = free_port(HOST)
        self.probe_port = free_port(HOST)
        self.startup_timeout = startup_timeout
        self.dir = Path(tempfile.mkdtemp(prefix="duplex-lws-"))
        self.log_path = self.dir / "lws.log"
        self.process: subprocess.Popen[bytes] | None = None
        self._configurations: list[dict[str, Any]] = []

    def _kubectl(self, *args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        argv = [str(self.cluster.kubectl), f"--kubeconfig={self.cluster.kubeconfig}", *args]
        proc = subprocess.run(argv, input=input, capture_output=True, text=True, timeout=120)
        if check and proc.returncode != 0:
            raise LaunchError(f"kubectl {' '.join(args)}: {proc.stderr.strip()}")
        return proc

    def install_crds(self) -> list[str]:
        """Apply the release's CRDs (server-side: they are too large for apply's last-applied annotation) and wait
        until they are Established; their names."""
        crds = self.release / "crds.yaml"
        names = [d["metadata"]["name"] for d in yaml.safe_load_all(crds.read_text()) if d]
        self._kubectl("apply", "--server-side", "--force-conflicts", "--field-manager=duplex-dev", "-f", str(crds))
        for name in names:  # polled: `kubectl wait` fails at once on a CRD whose status has no conditions yet
            wait_established(lambda *args: self._kubectl(*args).stdout, name)
        return names

    def uninstall_crds(self) -> None:
        """Delete the release's CRDs and with them every LeaderWorkerSet (its StatefulSets and pods follow by
        garbage collection)."""
        self._kubectl("delete", "--ignore-not-found", "--wait=false", "-f", str(self.release / "crds.yaml"))

    def start(self) -> LWSController:
        self.install_crds()
        cert_dir = self.dir / "certs"
        cert_dir.mkdir()
        cert, key = serving_cert()
        (cert_dir / "tls.crt").write_bytes(cert)
        (cert_dir / "tls.key").write_bytes(key)
        (cert_dir / "tls.key").chmod(0o600)
        config = self.dir / "config.yaml"
        config.write_text(yaml.safe_dump(controller_config(self.webhook_port, self.probe_port, cert_dir)))
        argv = [str(self.release / "lws"), f"--kubeconfig={self.cluster.kubeconfig}", f"--config={config}"]
        env = {k: v for k, v in os.environ.items() if k not in ("ENABLE_WEBHOOKS", "KUBECONFIG")}
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        released = [d for d in yaml.safe_load_all((self.release / "webhooks.yaml").read_text()) if d]
        self._configurations = webhook_configurations(released, f"https://{HOST}:{self.webhook_port}", cert)
        docs = "".join("---\n" + json.dumps(doc) + "\n" for doc in self._configurations)
        try:
            self._kubectl("apply", "-f", "-", input=docs)
            processes.Startup(
                f"lws controller (webhooks on https://{HOST}:{self.webhook_port}, probes on {HOST}:{self.probe_port})",
                self._serving,
                self.process.poll,
                self.log_path,
                self.startup_timeout,
            ).wait(interval=0.5)
        except LaunchError:
            self.stop()
            raise
        return self

    def _serving(self) -> bool:
        """True once its probes answer and the apiserver admits a LeaderWorkerSet through its webhooks."""
        if not processes.answers(f"http://{HOST}:{self.probe_port}/readyz"):
            return False
        probe = self._kubectl("create", "--dry-run=server", "-f", "-", input=json.dumps(PROBE), check=False)
        return probe.returncode == 0

    def log_tail(self, lines: int = 40) -> str:
        return processes.log_tail(self.log_path, lines)

    def stop(self) -> int | None:
        """Unregister the webhooks (when the apiserver is still up), stop; the directory goes unless it did not exit
        cleanly."""
        for doc in self._configurations:
            name = f"{doc['kind'].lower()}/{doc['metadata']['name']}"
            self._kubectl("delete", name, "--ignore-not-found", "--wait=false", check=False)
        code = processes.stop_child(self.process, timeout=10)
        if code == 0:
            shutil.rmtree(self.dir, ignore_errors=True)
        return code

    def __enter__(self) -> LWSController:
        return self.start()

    def __exit__(self, *_: Any) -> None:
        self.stop()

"""The command lines of the local control plane's components: a pure function from the state dir layout, the ports
and the bin dir to each component's argv and health URL."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from duplex_dev.cluster.addresses import KWOK_POD_CIDR, NODELESS_SERVICE_CIDR
from duplex_dev.cluster.node_config import NODE_NAME
from duplex_dev.cluster.pki import PKIPaths

SA_ISSUER = "https://kubernetes.default.svc.cluster.local"
KWOK_NODE_SELECTOR = "kwok.x-k8s.io/node=fake"
HEALTH_PATHS = "/healthz,/readyz,/livez,/metrics"

# Start order; `down` stops in reverse.
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")

# The identity (client cert user, groups) each API client component runs as. The first two are the users the
# apiserver's bootstrap RBAC policy grants exactly what those components need; kwok plays every kubelet, so it is an
# admin. Distinct users keep the audit log readable: a test can tell its own writes from the control plane's.
IDENTITIES = {
    "kube-controller-manager": ("system:kube-controller-manager", ()),
    "kube-scheduler": ("system:kube-scheduler", ()),
    "kwok": ("kwok-controller", ("system:masters",)),
}

# Every request at Metadata level: who did which verb on which object, never bodies (tests count write verbs).
AUDIT_POLICY = """\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Metadata
"""


@dataclass(frozen=True)
class Layout:
    """Files and dirs inside one cluster state dir."""

    root: Path

    @property
    def state_file(self) -> Path:
        return self.root / "state.json"

    @property
    def lock_file(self) -> Path:
        return self.root / ".lock"

    @property
    def pki(self) -> PKIPaths:
        return PKIPaths(self.root / "pki")

    @property
    def kubeconfig(self) -> Path:
        return self.root / "kubeconfig"

    def component_kubeconfig(self, component: str) -> Path:
        return self.root / "kubeconfigs" / f"{component}.kubeconfig"

    @property
    def users_dir(self) -> Path:
        return self.root / "users"

    @property
    def etcd_data(self) -> Path:
        return self.root / "etcd-data"

    @property
    def audit_policy(self) -> Path:
        return self.root / "audit-policy.yaml"

    @property
    def audit_log(self) -> Path:
        return self.root / "audit.log"

    @property
    def logs_dir(self) -> Path:
        return self.root / "logs"

    @property
    def apiserver_cert_dir(self) -> Path:
        return self.root / "apiserver-certs"

    @property
    def node_dir(self) -> Path:
        """The first real node's files (node_config.NodeLayout)."""
        return self.root / "node"

    def node_dir_of(self, name: str) -> Path:
        """A real node's files: `node` for the first, `node-b`, `node-c`, ... for the others."""
        return self.node_dir if name == NODE_NAME else self.root / f"node-{name.removeprefix(NODE_NAME + '-')}"

    def pid_file(self, component: str) -> Path:
        """For shell users; state.json is what LocalCluster trusts (it also records each process's start time)."""
        return self.root / "pids" / f"{component}.pid"

    def log(self, component: str) -> Path:
        return self.logs_dir / f"{component}.log"

    def runtime_paths(self) -> list[Path]:
        """Everything `down` removes (the logs stay for post-mortems)."""
        return [
            self.state_file,
            self.pki.root,
            self.kubeconfig,
            self.root / "kubeconfigs",
            self.users_dir,
            self.root / "pids",
            self.etcd_data,
            self.audit_policy,
            self.audit_log,
            self.apiserver_cert_dir,
        ]


@dataclass(frozen=True)
class Network:
    """Which Services the apiserver hands out, and whether a real node runs (the apiserver then listens on the host's
    end of the node's link, `Ports.host`, where pods reach it through the `kubernetes` Service)."""

    service_cidr: str = NODELESS_SERVICE_CIDR
    node_slot: int | None = None

    @property
    def with_node(self) -> bool:
        return self.node_slot is not None


@dataclass(frozen=True)
class Ports:
    etcd_client: int
    etcd_peer: int
    apiserver: int
    controller_manager: int
    scheduler: int
    kwok: int
    host: str = "127.0.0.1"  # the apiserver's address: loopback, or the host's end of the real node's link

    @property
    def server(self) -> str:
        return f"https://{self.host}:{self.apiserver}"


def argv(component: str, layout: Layout, ports: Ports, bin_dir: Path, network: Network | None = None) -> list[str]:
    network = network or Network()
    pki = layout.pki
    kubeconfig = str(layout.component_kubeconfig(component))
    if component == "etcd":
        client = f"http://127.0.0.1:{ports.etcd_client}"
        peer = f"http://127.0.0.1:{ports.etcd_peer}"
        return [
            str(bin_dir / "etcd"),
            "--name=duplex",
            f"--data-dir={layout.etcd_data}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=duplex={peer}",
            "--unsafe-no-fsync=true",  # throwaway data: do not pay fsyncs on a shared 2-core box
            "--log-level=warn",
        ]
    if component == "kube-apiserver":
        return [
            str(bin_dir / "kube-apiserver"),
            f"--etcd-servers=http://127.0.0.1:{ports.etcd_client}",
            "--etcd-prefix=/registry",
            f"--bind-address={ports.host}",
            f"--advertise-address={ports.host}",
            f"--secure-port={ports.apiserver}",
            f"--cert-dir={layout.apiserver_cert_dir}",
            f"--tls-cert-file={pki.apiserver_cert}",
            f"--tls-private-key-file={pki.apiserver_key}",
            f"--client-ca-file={pki.ca_cert}",
            # Request-header auth for aggregated APIs; also what KCM and the scheduler expect to find published.
            f"--requestheader-client-ca-file={pki.front_proxy_ca_cert}",
            "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={pki.front_proxy_client_cert}",
            f"--proxy-client-key-file={pki.front_proxy_client_key}",
            "--authorization-mode=Node,RBAC",
            # The defaults (NamespaceLifecycle, ServiceAccount, PodSecurity, ResourceQuota, ...) stay on; add these.
            "--enable-admission-plugins=NodeRestriction",
            f"--service-cluster-ip-range={network.service_cidr}",
            "--allow-privileged=true",
            # Loopback cannot be published as the `kubernetes` endpoint; the node's link address can, and pods need it.
            f"--endpoint-reconciler-type={'lease' if network.with_node else 'none'}",
            # The apiserver's own identity towards the kubelet (logs, exec, port-forward).
            f"--kubelet-client-certificate={pki.kubelet_client_cert}",
            f"--kubelet-client-key={pki.kubelet_client_key}",
            "--kubelet-preferred-address-types=InternalIP",
            f"--service-account-issuer={SA_ISSUER}",
            f"--service-account-key-file={pki.sa_pub}",
            f"--service-account-signing-key-file={pki.sa_key}",
            f"--audit-policy-file={layout.audit_policy}",
            f"--audit-log-path={layout.audit_log}",
            "--audit-log-format=json",
            "--audit-log-mode=blocking",  # an event is on disk before the response: tests read it right after
            "--audit-log-maxsize=0",  # no rotation: tests scan one file
            "--profiling=false",
        ]
    if component == "kube-controller-manager":
        return [
            str(bin_dir / "kube-controller-manager"),
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            f"--authorization-always-allow-paths={HEALTH_PATHS}",
            "--bind-address=127.0.0.1",
            f"--secure-port={ports.controller_manager}",
            "--leader-elect=false",
            "--controllers=*",
            # Each controller acts as its own ServiceAccount, as on kubeadm/EKS: the audit log names the controller.
            "--use-service-account-credentials=true",
            f"--root-ca-file={pki.ca_cert}",
            f"--service-account-private-key-file={pki.sa_key}",
            f"--cluster-signing-cert-file={pki.ca_cert}",
            f"--cluster-signing-key-file={pki.ca_key}",
            f"--service-cluster-ip-range={network.service_cidr}",
            "--kube-api-qps=100",
            "--kube-api-burst=200",
            # kwok renews node leases; under a busy compile a renewal can be late, which must not taint the nodes.
            "--node-monitor-grace-period=120s",
            "--profiling=false",
        ]
    if component == "kube-scheduler":
        return [
            str(bin_dir / "kube-scheduler"),
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            f"--authorization-always-allow-paths={HEALTH_PATHS}",
            "--bind-address=127.0.0.1",
            f"--secure-port={ports.scheduler}",
            "--leader-elect=false",
            "--profiling=false",
        ]
    if component == "kwok":
        return [
            str(bin_dir / "kwok"),
            f"--kubeconfig={kubeconfig}",
            f"--config={bin_dir / 'kwok-stages.yaml'}",
            "--manage-all-nodes=false",
            f"--manage-nodes-with-annotation-selector={KWOK_NODE_SELECTOR}",
            f"--cidr={KWOK_POD_CIDR}",
            f"--server-address=127.0.0.1:{ports.kwok}",
            "--node-lease-duration-seconds=40",
        ]
    raise ValueError(f"unknown component {component!r}")


def health_url(component: str, ports: Ports) -> str:
    """Where the component says it is healthy (the apiserver's /readyz needs a client cert; see APIClient.ready)."""
    return {
        "etcd": f"http://127.0.0.1:{ports.etcd_client}/health",
        "kube-apiserver": f"{ports.server}/readyz",
        "kube-controller-manager": f"https://127.0.0.1:{ports.controller_manager}/healthz",
        "kube-scheduler": f"https://127.0.0.1:{ports.scheduler}/healthz",
        "kwok": f"http://127.0.0.1:{ports.kwok}/healthz",
    }[component]

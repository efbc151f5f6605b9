"""The real node's configuration files, as pure functions of its layout and addresses: containerd's config, the CNI
network, the kubelet's and kube-proxy's configurations. Each setting that differs from a stock node says why."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import yaml

from duplex_dev.cluster.addresses import TEST_RANGE, NodeAddresses

NODE_NAME = "duplex-node"  # the cluster's first real node; the others are duplex-node-b, duplex-node-c, ...
# What must really run (the local examples, the chart's operator) selects the node by this label; without it a pod
# could land on a fake node, where kwok reports it Running and nothing runs.
NODE_LABEL = ("duplex.dev/real-node", "true")
# `helm --set-string` of the chart value that puts the operator on the node (helm reads an unescaped dot as a path).
CHART_NODE_SELECTOR = "nodeSelector." + NODE_LABEL[0].replace(".", "\\.") + "=" + NODE_LABEL[1]
PAUSE_IMAGE = "localhost/duplex/pause:1"
KUBELET_HEALTHZ_PORT = 10248
KUBE_PROXY_HEALTHZ_PORT = 10256
COREDNS_HEALTH_PORT = 10257
CLUSTER_DOMAIN = "cluster.local"
CNI_PLUGINS = Path("/usr/lib/cni")  # Debian's containernetworking-plugins
RUNC = Path("/usr/sbin/runc")  # Debian's runc; crun refuses cgroups in hybrid mode


def node_name(index: int) -> str:
    """The name of a cluster's real node by its position: the first keeps NODE_NAME, which the tools and docs use."""
    if not 0 <= index < 26:
        raise ValueError(f"real node {index} is outside 0..25")
    return NODE_NAME if index == 0 else f"{NODE_NAME}-{chr(ord('a') + index)}"


@dataclass(frozen=True)
class NodeLayout:
    """Files and dirs of the real node inside a cluster's state dir. Everything the node writes is under `root`, but
    the pods' logs."""

    root: Path
    name: str = NODE_NAME

    @property
    def containerd_root(self) -> Path:
        return self.root / "containerd"

    @property
    def containerd_state(self) -> Path:
        return self.root / "containerd-state"

    @property
    def containerd_socket(self) -> Path:
        return self.root / "containerd.sock"

    @property
    def containerd_config(self) -> Path:
        return self.root / "containerd.toml"

    @property
    def cni_conf_dir(self) -> Path:
        return self.root / "cni"

    @property
    def cni_ipam_dir(self) -> Path:
        return self.root / "cni-ipam"

    @property
    def kubelet_root(self) -> Path:
        return self.root / "kubelet"

    @property
    def kubelet_config(self) -> Path:
        return self.root / "kubelet.yaml"

    @property
    def resolv_conf(self) -> Path:
        return self.root / "resolv.conf"

    @property
    def pod_logs(self) -> Path:
        """Beside the cluster's other logs (outside `root`), so that they outlive `down` for post-mortems. One dir per
        node: a kubelet removes the log dirs of pods it does not know from its own."""
        return self.root.parent / "logs" / ("pods" if self.name == NODE_NAME else f"pods-{self.name}")

    @property
    def corefile(self) -> Path:
        return self.root / "Corefile"

    @property
    def kube_proxy_config(self) -> Path:
        return self.root / "kube-proxy.yaml"

    def kubeconfig(self, component: str) -> Path:
        return self.root / f"{component}.kubeconfig"


def containerd_toml(layout: NodeLayout) -> str:
    """containerd 2.x (config version 3): state, sockets and pod network namespaces under the layout; only the CRI,
    overlayfs and runc; no plugin that writes outside the layout (opt, NRI) or needs what is not here (CDI)."""
    ns_state = layout.containerd_state
    return f"""\
version = 3
root = {json.dumps(str(layout.containerd_root))}
state = {json.dumps(str(ns_state))}
disabled_plugins = [
  "io.containerd.internal.v1.opt",
  "io.containerd.nri.v1.nri",
  "io.containerd.snapshotter.v1.blockfile",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.tracing.processor.v1.otlp",
]

[grpc]
  address = {json.dumps(str(layout.containerd_socket))}

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{PAUSE_IMAGE}"

[plugins."io.containerd.cri.v1.runtime"]
  enable_cdi = false
  # This machine lets no process lower its OOM score (no CAP_SYS_RESOURCE): runc would fail to start every sandbox,
  # whose score the kubelet asks to lower. Scores then never go below containerd's own.
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = "{RUNC}"
        SystemdCgroup = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["{CNI_PLUGINS}"]
    conf_dir = {json.dumps(str(layout.cni_conf_dir))}
    use_internal_loopback = true
"""


def cni_conflist(layout: NodeLayout, addrs: NodeAddresses) -> str:
    """One bridge in the node's namespace, pod addresses from the slot's range, and in every pod a route to the test
    range only (no default route: a pod cannot send a packet anywhere else)."""
    doc = {
        "cniVersion": "1.0.0",
        "name": "duplex",
        "plugins": [
            {
                "type": "bridge",
                "bridge": "cni0",
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "dataDir": str(layout.cni_ipam_dir),
                    "ranges": [[{"subnet": addrs.pod_cidr, "gateway": addrs.pod_gateway}]],
                    "routes": [{"dst": TEST_RANGE}],
                },
            }
        ],
    }
    return json.dumps(doc, indent=2) + "\n"


def kubelet_yaml(layout: NodeLayout, addrs: NodeAddresses, ca_file: Path, cgroup_root: str) -> str:
    doc = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        # These machines run cgroups v1 (hybrid); Kubernetes 1.35+ refuses v1 unless told (KEP-5573).
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",  # no systemd as PID 1
        "cgroupRoot": cgroup_root,
        "containerRuntimeEndpoint": f"unix://{layout.containerd_socket}",
        "address": addrs.node,
        "readOnlyPort": 0,
        "healthzBindAddress": addrs.node,
        "healthzPort": KUBELET_HEALTHZ_PORT,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(ca_file)},
        },
        "authorization": {"mode": "Webhook"},
        "podLogsDir": str(layout.pod_logs),
        # CoreDNS answers on the node's address (corefile()); the node itself resolves nothing else.
        "clusterDNS": [addrs.node],
        "clusterDomain": CLUSTER_DOMAIN,
        "resolvConf": str(layout.resolv_conf),
        "failSwapOn": False,
        # The machine's disk is shared with everything else: never evict or collect images for its sake.
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "maxPods": 64,
        "serializeImagePulls": False,
        "nodeStatusUpdateFrequency": "4s",
        "syncFrequency": "10s",
        "fileCheckFrequency": "0s",
        "staticPodPath": "",
        "shutdownGracePeriod": "0s",
        "rotateCertificates": False,
        "serverTLSBootstrap": False,
        "localStorageCapacityIsolation": True,
    }
    return yaml.safe_dump(doc, sort_keys=False)


def kube_proxy_yaml(layout: NodeLayout, addrs: NodeAddresses) -> str:
    """`clusterCIDR` is the node's own pod range: a Service connection that does not come from one of its pods (the
    host's, through the first node) is masqueraded to the node's address, so that the reply comes back through this
    node's conntrack also from an endpoint on another node."""
    doc = {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "mode": "iptables",
        "clientConnection": {"kubeconfig": str(layout.kubeconfig("kube-proxy"))},
        "hostnameOverride": layout.name,
        "bindAddress": addrs.node,
        "clusterCIDR": addrs.pod_cidr,
        "healthzBindAddress": f"{addrs.node}:{KUBE_PROXY_HEALTHZ_PORT}",
        "metricsBindAddress": "127.0.0.1:10249",
        # The conntrack table size and timeouts are the host's (they are not per namespace): leave them alone.
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
        "iptables": {"syncPeriod": "30s", "minSyncPeriod": "0s"},
    }
    return yaml.safe_dump(doc, sort_keys=False)


def corefile(layout: NodeLayout, addrs: NodeAddresses) -> str:
    """Services and pods of cluster.local, and nothing else: there is no forward plugin, so a name outside the
    cluster gets an answer at once and no query leaves the node."""
    return f"""\
.:53 {{
    bind {addrs.node}
    errors
    health {addrs.node}:{COREDNS_HEALTH_PORT}
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa {{
        kubeconfig {layout.kubeconfig("coredns")}
        pods insecure
        fallthrough in-addr.arpa
    }}
    cache 30
}}
"""


def coredns_argv(binary: Path, layout: NodeLayout) -> list[str]:
    return [str(binary), "-conf", str(layout.corefile)]


def kubelet_argv(binary: Path, layout: NodeLayout, addrs: NodeAddresses) -> list[str]:
    return [
        str(binary),
        f"--config={layout.kubelet_config}",
        f"--kubeconfig={layout.kubeconfig('kubelet')}",
        f"--root-dir={layout.kubelet_root}",
        f"--cert-dir={layout.kubelet_root / 'pki'}",
        f"--hostname-override={layout.name}",
        f"--node-ip={addrs.node}",
        f"--node-labels={NODE_LABEL[0]}={NODE_LABEL[1]}",
        "--v=1",
    ]


def kube_proxy_argv(binary: Path, layout: NodeLayout) -> list[str]:
    return [str(binary), f"--config={layout.kube_proxy_config}", "--v=1"]


def containerd_argv(binary: Path, layout: NodeLayout) -> list[str]:
    return [str(binary), f"--config={layout.containerd_config}", "--log-level=warn"]

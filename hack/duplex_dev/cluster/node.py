"""A real kubelet node beside the kwok fleet: containerd, runc, the kubelet and kube-proxy, in a network namespace
(hostnet.py) and a cgroup subtree (cgroups.py) of their own, so that pods really run and `down` can prove nothing of
them is left. Images come from archives imported into containerd (no registry is reachable here)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from duplex_dev import processes
from duplex_dev.cluster import cgroups, hostnet, pki
from duplex_dev.cluster.addresses import NodeAddresses
from duplex_dev.cluster.node_config import (
    COREDNS_HEALTH_PORT,
    KUBE_PROXY_HEALTHZ_PORT,
    KUBELET_HEALTHZ_PORT,
    NODE_NAME,
    NodeLayout,
    cni_conflist,
    containerd_argv,
    containerd_toml,
    coredns_argv,
    corefile,
    kube_proxy_argv,
    kube_proxy_yaml,
    kubelet_argv,
    kubelet_yaml,
)
from duplex_dev.processes import ProcessRecord

# Start order; stop is the reverse.
NODE_COMPONENTS = ("containerd", "coredns", "kubelet", "kube-proxy")
# The kernel settings the kubelet sets when it starts (its setupKernelTunables; not per namespace): saved before
# the first node of the machine starts and put back when the last one stops.
KUBELET_SYSCTLS = (
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
)
# Machine-wide (every cluster's node shares the kernel), and on /run: a reboot resets both the values and the file.
SAVED_SYSCTLS = Path("/run/duplex-node-sysctls.json")


UNIX_PATH_MAX = 107  # sun_path is 108 bytes with its NUL


class NodeError(RuntimeError):
    def __init__(self, component: str, message: str, log_tail: str = ""):
        self.component = component
        self.log_tail = log_tail
        text = f"{component}: {message}"
        if log_tail:
            text += f"\n--- last lines of its log ---\n{log_tail}"
        super().__init__(text)


@dataclass(frozen=True)
class NodeBinaries:
    kubelet: Path
    kube_proxy: Path
    containerd_dir: Path  # containerd, containerd-shim-runc-v2 and ctr
    coredns: Path

    @property
    def containerd(self) -> Path:
        return self.containerd_dir / "containerd"

    @property
    def ctr(self) -> Path:
        return self.containerd_dir / "ctr"

    def missing(self) -> list[str]:
        paths = [
            self.kubelet,
            self.kube_proxy,
            self.containerd,
            self.ctr,
            self.containerd_dir / "containerd-shim-runc-v2",
        ]
        found = [str(p) for p in paths if not os.access(p, os.X_OK)]
        found += [str(p) for p in (Path("/usr/sbin/runc"), Path("/usr/lib/cni/bridge")) if not p.exists()]
        return found


class RealNode:
    """A real node of one cluster. Its processes are recorded in the cluster's state (`records`, by `key`), like the
    control plane's, so another process can stop it."""

    def __init__(self, root: Path, addrs: NodeAddresses, say: Callable[[str], None], name: str = NODE_NAME):
        self.layout = NodeLayout(root, name)
        self.addrs = addrs
        self._say = say

    @property
    def name(self) -> str:
        return self.layout.name

    def key(self, component: str) -> str:
        """The name a daemon of this node has in the cluster's state and logs: `kubelet` on the first node (as with
        one node), `duplex-node-b/kubelet` on the others."""
        return component if self.name == NODE_NAME else f"{self.name}/{component}"

    # ----- start -----

    def write_config(self, cluster_pki: pki.PKIPaths, server: str) -> None:
        layout, addrs = self.layout, self.addrs
        # The kubelet's deepest unix socket: pod-resources/<10 digits>, under the 107 bytes a socket path may take.
        deepest = len(str(layout.kubelet_root / "pod-resources" / ("0" * 10)).encode())
        if deepest > UNIX_PATH_MAX:
            raise NodeError(
                "kubelet",
                f"the cluster's state dir is too deep for the kubelet's unix sockets ({deepest} > {UNIX_PATH_MAX} "
                f"bytes under {layout.root}): choose a shorter DUPLEX_CLUSTER_DIR",
            )
        for path in (layout.root, layout.cni_conf_dir, layout.pod_logs, layout.kubelet_root):
            path.mkdir(parents=True, exist_ok=True)
        layout.containerd_config.write_text(containerd_toml(layout))
        (layout.cni_conf_dir / "10-duplex.conflist").write_text(cni_conflist(layout, addrs))
        layout.resolv_conf.write_text(
            "# the node resolves nothing outside the cluster: pods ask CoreDNS (clusterDNS)\n"
        )
        layout.kubelet_config.write_text(kubelet_yaml(layout, addrs, cluster_pki.ca_cert, addrs.cgroup_root))
        layout.kube_proxy_config.write_text(kube_proxy_yaml(layout, addrs))
        layout.corefile.write_text(corefile(layout, addrs))
        ca = cluster_pki.ca_cert.read_bytes()
        for component, user, groups in (
            ("kubelet", f"system:node:{self.name}", ["system:nodes"]),
            ("kube-proxy", "system:kube-proxy", []),
            # Services, EndpointSlices and namespaces of every namespace, read-only in effect (dev tooling: no
            # ClusterRole is bootstrapped for it, as for kwok).
            ("coredns", "system:coredns", ["system:masters"]),
        ):
            cert, key = pki.client_cert(cluster_pki, user, groups)
            pki.write_kubeconfig(
                layout.kubeconfig(component), pki.kubeconfig(server, ca, user, cert_pem=cert, key_pem=key)
            )

    def launch(self, component: str, binaries: NodeBinaries, log: Path) -> ProcessRecord:
        """Start a node daemon inside the node's network namespace and cgroup."""
        argv = {
            "containerd": lambda: containerd_argv(binaries.containerd, self.layout),
            "kubelet": lambda: kubelet_argv(binaries.kubelet, self.layout, self.addrs),
            "kube-proxy": lambda: kube_proxy_argv(binaries.kube_proxy, self.layout),
            "coredns": lambda: coredns_argv(binaries.coredns, self.layout),
        }[component]()
        cgroups.create(self.addrs.cgroup_root, component)
        join = cgroups.join_command(self.addrs.cgroup_root, component)
        # nsenter, not `ip netns exec`: that also remounts /sys for the namespace, which hides /sys/fs/cgroup.
        netns = f"--net=/run/netns/{self.addrs.netns}"
        wrapped = ["nsenter", netns, "sh", "-c", f'{join}; exec "$@"', component, *argv]
        env = {
            "PATH": f"{binaries.containerd_dir}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": str(self.layout.root),
        }
        return processes.spawn(wrapped, log, env=env)

    def healthy(self, component: str) -> bool:
        if component == "containerd":
            with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX) as sock:
                sock.settimeout(1.0)
                sock.connect(str(self.layout.containerd_socket))
                return True
            return False
        port, path = {
            "kubelet": (KUBELET_HEALTHZ_PORT, "/healthz"),
            "kube-proxy": (KUBE_PROXY_HEALTHZ_PORT, "/healthz"),
            "coredns": (COREDNS_HEALTH_PORT, "/health"),
        }[component]
        try:
            with urllib.request.urlopen(f"http://{self.addrs.node}:{port}{path}", timeout=2) as resp:
                return resp.status == 200
        except OSError:
            return False

    def proxied_to(self, namespace: str, service: str) -> set[str]:
        """The pod addresses kube-proxy's rules in the node send a Service's new connections to: an EndpointSlice
        change reaches them only at kube-proxy's next sync."""
        argv = ["nsenter", f"--net=/run/netns/{self.addrs.netns}", "iptables-save", "-t", "nat"]
        rules = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=30).stdout
        name = re.escape(f"{namespace}/{service}")
        jump = re.compile(rf'^-A KUBE-SVC-\S+ .*--comment "{name}(?::\S+)? -> ([\d.]+):\d+"', re.M)
        return set(jump.findall(rules))

    def import_image(self, binaries: NodeBinaries, archive: Path) -> str:
        """Import an OCI archive into the CRI's image namespace; returns what ctr printed."""
        proc = subprocess.run(
            [
                str(binaries.ctr),
                f"--address={self.layout.containerd_socket}",
                "--namespace=k8s.io",
                "images",
                "import",
                str(archive),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            raise NodeError("containerd", f"importing {archive} failed: {proc.stderr.strip() or proc.stdout.strip()}")
        return proc.stdout.strip()

    # ----- stop -----

    def stop(self, records: dict[str, ProcessRecord]) -> list[str]:
        """Stop the daemons, kill what the cgroup still holds (shims, containers), unmount what they mounted,
        remove the cgroups and the network. Returns what is left (empty when the node is gone)."""
        stuck = self.stop_processes(records)
        self.unwire()
        return stuck + self.leftovers()

    def stop_processes(self, records: dict[str, ProcessRecord]) -> list[str]:
        """`stop` but the network: a cluster stops every node's pods before it removes any node's routes, so that
        no pod sends to a node whose routes are gone (the host would route that packet by its default route).
        `records` by component name. Returns the processes that would not die."""
        for name in reversed(NODE_COMPONENTS):
            record = records.get(name)
            if record is not None:
                processes.stop(record, grace=5.0)
        stuck = cgroups.kill_all(self.addrs.cgroup_root)
        unmount_under(self.layout.root)
        cgroups.remove(self.addrs.cgroup_root)
        return [f"pid {pid}" for pid in sorted(stuck)]

    def unwire(self) -> None:
        hostnet.unwire(self.addrs)
        restore_sysctls()

    def leftovers(self) -> list[str]:
        """Processes, mounts, cgroups and network of this node that still exist."""
        found = [f"pid {pid} in the node's cgroup" for pid in sorted(cgroups.pids(self.addrs.cgroup_root))]
        found += [f"mount {m}" for m in mounts_under(self.layout.root)]
        found += [f"cgroup {c}" for c in cgroups.leftovers(self.addrs.cgroup_root)]
        found += hostnet.leftovers(self.addrs)
        return found

    def remove_files(self) -> None:
        """The node's files but its logs (what `down` keeps for post-mortems). Only after `stop` left nothing
        mounted: removing a tree with a live mount in it would reach into the mounted filesystem."""
        if mounts_under(self.layout.root):
            return
        for child in self.layout.root.iterdir() if self.layout.root.exists() else ():
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child, ignore_errors=True)
            elif child.suffix != ".log":
                child.unlink(missing_ok=True)


# ----- mounts -----


def _unescape(path: str) -> str:
    return path.encode().decode("unicode_escape") if "\\" in path else path


def mounts_under(root: Path) -> list[str]:
    """Mount points at or below `root` (from /proc/self/mountinfo), deepest first."""
    prefix = str(root.resolve())
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = _unescape(line.split()[4])
        if point == prefix or point.startswith(prefix + "/"):
            found.append(point)
    return sorted(set(found), key=lambda p: p.count("/"), reverse=True)


def unmount_under(root: Path) -> None:
    for _ in range(3):  # a mount can sit on another; each pass takes the top ones off
        points = mounts_under(root)
        if not points:
            return
        for point in points:
            if subprocess.run(["umount", point], capture_output=True).returncode != 0:
                subprocess.run(["umount", "-l", point], capture_output=True)


# ----- the kernel settings the kubelet changes -----


def save_sysctls() -> None:
    """Keep the machine's values before the first node starts (a second node finds them saved already)."""
    if SAVED_SYSCTLS.exists():
        return
    values = {key: Path(f"/proc/sys/{key}").read_text().strip() for key in KUBELET_SYSCTLS}
    SAVED_SYSCTLS.parent.mkdir(parents=True, exist_ok=True)
    SAVED_SYSCTLS.write_text(json.dumps(values, indent=2) + "\n")


def restore_sysctls() -> None:
    """Put the saved values back once no node of any cluster runs."""
    if not SAVED_SYSCTLS.exists() or any(Path("/run/netns").glob("duplex-node-*")):
        return
    for key, value in json.loads(SAVED_SYSCTLS.read_text()).items():
        with contextlib.suppress(OSError):
            Path(f"/proc/sys/{key}").write_text(value)
    SAVED_SYSCTLS.unlink()


def wait_until(check: Callable[[], bool], deadline: float, what: str, interval: float = 0.25) -> None:
    while not check():
        if time.monotonic() > deadline:
            raise NodeError("node", f"{what}: not after the deadline")
        time.sleep(interval)

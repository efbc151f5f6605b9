"""A real local Kubernetes control plane without containers: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler and kwok as detached processes, plus fake EKS EFA GPU nodes. One state dir holds its PKI, kubeconfig,
audit log, logs and a JSON state file, so a later process (`duplex-dev cluster down`, pytest) can find and stop it."""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
import os
import re
import shutil
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

from duplex_dev import processes
from duplex_dev.cluster import components, hostnet, pki, rest, tools
from duplex_dev.cluster.addresses import NodeAddresses, nodeless_kubernetes_service_ip
from duplex_dev.cluster.components import COMPONENTS, Layout, Network, Ports
from duplex_dev.cluster.node import NODE_COMPONENTS, RealNode, save_sysctls
from duplex_dev.cluster.node_config import NODE_NAME, node_name
from duplex_dev.processes import ProcessRecord

STATE_VERSION = 1

# Per-component startup budgets in seconds, each further capped by what is left of the overall timeout.
BUDGETS = {
    "etcd": 30.0,
    "kube-apiserver": 120.0,
    "kube-controller-manager": 60.0,
    "kube-scheduler": 60.0,
    "kwok": 60.0,
    "nodes": 90.0,
    "serviceaccount": 90.0,
    "containerd": 30.0,
    "coredns": 30.0,
    "kubelet": 60.0,
    "kube-proxy": 60.0,
    "real node": 90.0,
}
# Taints the control plane itself puts on a node that is not (yet) usable.
NOT_READY_TAINTS = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")


def default_state_dir() -> Path:
    return Path(os.environ.get("DUPLEX_CLUSTER_DIR") or "~/.cache/duplex/cluster").expanduser()


class ClusterError(RuntimeError):
    """A component failed; carries its name and the tail of its log."""

    def __init__(self, component: str, message: str, log_tail: str = "", log_path: str | Path | None = None):
        self.component = component
        self.message = message
        self.log_tail = log_tail
        self.log_path = str(log_path) if log_path else None
        text = f"{component}: {message}"
        if log_tail:
            text += f"\n--- last lines of {self.log_path or 'its log'} ---\n{log_tail}"
        super().__init__(text)


@dataclass
class ComponentHealth:
    name: str
    pid: int | None
    alive: bool
    healthy: bool


@dataclass
class ClusterStatus:
    state_dir: Path
    components: list[ComponentHealth] = field(default_factory=list)
    nodes: list[dict] = field(default_factory=list)
    kubeconfig: Path | None = None
    server: str | None = None

    @property
    def running(self) -> bool:
        return bool(self.components) and all(c.alive and c.healthy for c in self.components)

    def render(self) -> str:
        if not self.components:
            return f"no cluster in {self.state_dir}"
        lines = [f"cluster in {self.state_dir}: {'running' if self.running else 'NOT HEALTHY'}"]
        if self.server:
            lines.append(f"  apiserver   {self.server}   kubeconfig {self.kubeconfig}")
        for c in self.components:
            state = "healthy" if c.alive and c.healthy else ("unhealthy" if c.alive else "not running")
            lines.append(f"  {c.name:<24} pid {c.pid!s:<8} {state}")
        if self.nodes:
            lines.append(f"  {'NODE':<14} {'TYPE':<15} {'READY':<6} {'GPU':>4} {'NEURON':>6} {'EFA':>4}")
            for n in self.nodes:
                lines.append(
                    f"  {n['name']:<14} {n['instance_type']:<15} {n['ready']!s:<6} {n['gpu']:>4} "
                    f"{n['neuron']:>6} {n['efa']:>4}"
                )
        return "\n".join(lines)


def _free_ports(count: int) -> list[int]:
    return [processes.free_port() for _ in range(count)]


def _safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text)


def _node_entries(state: dict | None) -> list[dict]:
    """The real nodes a state file records, first first: `nodes` (name, slot), or the one node of a state written
    before there could be two (`network.node_slot`)."""
    state = state or {}
    if "nodes" in state:
        return list(state["nodes"])
    slot = state.get("network", {}).get("node_slot")
    return [] if slot is None else [{"name": NODE_NAME, "slot": slot}]


def _node_summary(node: dict) -> dict:
    meta, status = node.get("metadata", {}), node.get("status", {})
    alloc = status.get("allocatable", {})
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions", []))
    return {
        "name": meta.get("name", "?"),
        "instance_type": meta.get("labels", {}).get("node.kubernetes.io/instance-type", "-"),
        "ready": ready,
        "gpu": alloc.get("nvidia.com/gpu", "-"),
        "neuron": alloc.get("aws.amazon.com/neuron", "-"),
        "efa": alloc.get("vpc.amazonaws.com/efa", "-"),
        "taints": [t.get("key") for t in node.get("spec", {}).get("taints", []) or []],
    }


class LocalCluster:
    """One local control plane, identified by its state dir. Safe to construct when nothing runs."""

    def __init__(
        self,
        state_dir: str | Path | None = None,
        bin_dir: str | Path | None = None,
        nodes_file: str | Path | None = None,
        echo: Callable[[str], None] | None = None,
        real_node: bool = False,
        real_nodes: int | None = None,
    ):
        """`real_nodes`: how many real nodes to start, each in a slot of its own (addresses.py); `real_node=True` is
        one. Reading, stopping and importing need neither: they follow the state file."""
        self.layout = Layout(Path(state_dir).expanduser().resolve() if state_dir else default_state_dir().resolve())
        self._bin_dir = Path(bin_dir).expanduser() if bin_dir else None
        self.real_nodes = int(real_node) if real_nodes is None else real_nodes
        if not 0 <= self.real_nodes <= 26:
            raise ValueError(f"real_nodes={self.real_nodes}: 0..26")
        self.real_node = self.real_nodes > 0
        self.nodes_file = Path(nodes_file) if nodes_file else tools.FAKE_NODES
        self._echo = echo or (lambda line: print(line, file=sys.stderr, flush=True))
        self._t0 = time.monotonic()

    # ----- what a caller reads -----

    @property
    def state_dir(self) -> Path:
        return self.layout.root

    @property
    def kubeconfig(self) -> Path:
        return self.layout.kubeconfig

    @property
    def audit_log_path(self) -> Path:
        return self.layout.audit_log

    @property
    def bin_dir(self) -> Path:
        state = self._load_state()
        if state:
            return Path(state["bin_dir"])
        if self._bin_dir is None:
            self._bin_dir = tools.locate(None)
        return self._bin_dir

    @property
    def kubectl(self) -> Path:
        return self.bin_dir / "kubectl"

    @property
    def server(self) -> str:
        return Ports(**self._require_state()["ports"]).server

    def log_path(self, component: str) -> Path:
        return self.layout.log(component)

    def log_tails(self, lines: int = 30) -> dict[str, str]:
        nodes = self.nodes
        keys = [node.key(c) for node in nodes for c in NODE_COMPONENTS] if nodes else NODE_COMPONENTS
        names = (*COMPONENTS, *keys)
        return {c: processes.log_tail(self.layout.log(c), lines) for c in names if self.layout.log(c).exists()}

    @property
    def nodes(self) -> list[RealNode]:
        """The real nodes this cluster runs, `duplex-node` first (none without)."""
        return [self._real_node(entry["name"], entry["slot"]) for entry in _node_entries(self._load_state())]

    @property
    def node(self) -> RealNode | None:
        """The first real node, `duplex-node`, when this cluster runs one: the host reaches the Services through
        it (its kube-proxy's rules are the ones a client on the host goes through)."""
        nodes = self.nodes
        return nodes[0] if nodes else None

    def process_records(self) -> dict[str, ProcessRecord]:
        """Every process of the cluster the state file records (control plane and node daemons)."""
        state = self._load_state() or {}
        return {name: ProcessRecord.from_json(data) for name, data in state.get("processes", {}).items()}

    def import_image(self, archive: Path) -> str:
        """Import an image archive (OCI or docker, as `buildah push` writes) into every real node's containerd;
        returns what the first import printed."""
        nodes = self.nodes
        if not nodes:
            raise ClusterError("cluster", "no real node in this cluster: start it with real_node=True (--real-node)")
        binaries, printed = tools.node_binaries(self.bin_dir), []
        for node in nodes:
            self._say(f"importing {archive.name} ({archive.stat().st_size / 2**20:.0f} MiB) into {node.name}")
            printed.append(node.import_image(binaries, archive))
        return printed[0]

    def is_running(self) -> bool:
        return self.status(with_nodes=False).running

    # ----- lifecycle -----

    def up(self, timeout: float = 300.0, build: bool = False) -> None:
        """Start everything (or say it already runs). `build` runs hack/build-tools.sh first (build or reuse)."""
        self._t0 = time.monotonic()
        self.layout.root.mkdir(parents=True, exist_ok=True)
        with self._locked():
            state = self._load_state()
            if state is not None:
                if self.status(with_nodes=False).running:
                    self._say(f"already running: {Ports(**state['ports']).server}, kubeconfig {self.kubeconfig}")
                    return
                self._say("found a stale or half-dead cluster in this dir: stopping what is left first")
                self._stop_all(state)
            self._remove_runtime()
            bin_dir = tools.build_or_reuse(self._bin_dir) if build else tools.locate(self._bin_dir)
            self._bin_dir = bin_dir
            self._say(f"binaries from {bin_dir}")
            deadline = time.monotonic() + timeout
            try:
                self._start(bin_dir, timeout)
            except ClusterError as err:
                # Free ports are picked before the components bind them; another process may win that race once.
                if "address already in use" not in err.log_tail:
                    raise
                self._say(f"{err.component} lost a port race; retrying once with fresh ports")
                self._start(bin_dir, max(1.0, deadline - time.monotonic()))

    def _start(self, bin_dir: Path, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        layout = self.layout
        layout.logs_dir.mkdir(parents=True, exist_ok=True)
        nodes = self._wire_nodes(self.real_nodes)
        addrs = nodes[0].addrs if nodes else None
        if addrs is None:
            network, host, apiserver_ips = Network(), "127.0.0.1", [nodeless_kubernetes_service_ip()]
        else:
            network = Network(service_cidr=addrs.service_cidr, node_slot=addrs.slot)
            host, apiserver_ips = addrs.host, [addrs.host, addrs.kubernetes_service_ip]
        pki.mint(layout.pki, apiserver_ips)
        layout.audit_policy.write_text(components.AUDIT_POLICY)
        ports = Ports(*_free_ports(6), host=host)
        pki.write_kubeconfig(
            layout.kubeconfig,
            pki.kubeconfig(
                ports.server,
                layout.pki.ca_cert.read_bytes(),
                "duplex-admin",
                cert_pem=layout.pki.admin_cert.read_bytes(),
                key_pem=layout.pki.admin_key.read_bytes(),
            ),
        )
        for name, (user, groups) in components.IDENTITIES.items():
            cert, key = pki.client_cert(layout.pki, user, groups)
            pki.write_kubeconfig(
                layout.component_kubeconfig(name),
                pki.kubeconfig(ports.server, layout.pki.ca_cert.read_bytes(), user, cert_pem=cert, key_pem=key),
            )
        self._say(f"PKI and kubeconfigs written to {layout.root}")
        state = {
            "version": STATE_VERSION,
            "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "bin_dir": str(bin_dir),
            "kubeconfig": str(layout.kubeconfig),
            "audit_log": str(layout.audit_log),
            "ports": asdict(ports),
            "network": asdict(network),
            "nodes": [{"name": node.name, "slot": node.addrs.slot} for node in nodes],
            "processes": {},
        }
        self._save_state(state)
        try:
            self._launch(state, "etcd", ports, bin_dir)
            self._await_component(state, "etcd", ports, deadline)
            self._launch(state, "kube-apiserver", ports, bin_dir)
            self._await_component(state, "kube-apiserver", ports, deadline)
            for name in ("kube-controller-manager", "kube-scheduler", "kwok"):
                self._launch(state, name, ports, bin_dir)
            for name in ("kube-controller-manager", "kube-scheduler", "kwok"):
                self._await_component(state, name, ports, deadline)
            self._register_nodes(deadline)
            self._await_default_serviceaccount(deadline)
            if nodes:
                self._start_nodes(state, nodes, bin_dir, deadline)
        except BaseException:
            self._say("startup failed: stopping what was started")
            self._stop_all(state)
            self._remove_runtime()
            raise
        self._say(f"cluster up: {ports.server}  kubeconfig {layout.kubeconfig}")

    def down(self) -> list[str]:
        """Stop every recorded process group, verify none is left, remove the runtime state. Returns what was
        stopped. Nothing running is not an error."""
        if not self.layout.root.exists():
            return []
        with self._locked():
            state = self._load_state()
            stopped = self._stop_all(state) if state else []
            self._remove_runtime()
            return stopped

    def restart_apiserver(self, timeout: float = 120.0) -> None:
        """Stop the apiserver and start it again with the same flags on the same port (clients must reconnect)."""
        with self._locked():
            state = self._require_state()
            record = ProcessRecord.from_json(state["processes"]["kube-apiserver"])
            if not processes.stop(record):
                raise ClusterError("kube-apiserver", f"pid {record.pid} did not stop")
            self._say("kube-apiserver stopped; starting it again")
            new = processes.spawn(record.argv, Path(record.log), append_log=True)
            state["processes"]["kube-apiserver"] = new.to_json()
            self._save_state(state)
            self._write_pid_file("kube-apiserver", new)
            self._await_component(state, "kube-apiserver", Ports(**state["ports"]), time.monotonic() + timeout)

    def status(self, with_nodes: bool = True) -> ClusterStatus:
        result = ClusterStatus(state_dir=self.layout.root)
        state = self._load_state()
        if state is None:
            return result
        ports = Ports(**state["ports"])
        result.kubeconfig, result.server = Path(state["kubeconfig"]), ports.server
        api = self._api(ports) if self.layout.pki.exists() else None
        daemons = {node.key(c): (node, c) for node in self.nodes for c in NODE_COMPONENTS}
        for name in (*COMPONENTS, *daemons):
            data = state["processes"].get(name)
            if data is None:
                result.components.append(ComponentHealth(name, None, False, False))
                continue
            record = ProcessRecord.from_json(data)
            alive = processes.is_alive(record)
            if name in daemons:
                node, component = daemons[name]
                healthy = alive and node.healthy(component)
            else:
                healthy = alive and self._healthy(name, ports, api)
            result.components.append(ComponentHealth(name, record.pid, alive, healthy))
        if with_nodes and api is not None and result.running:
            with contextlib.suppress(OSError, TimeoutError, ValueError):
                resp = api.get("/api/v1/nodes")
                if resp.status == 200:
                    result.nodes = [_node_summary(n) for n in resp.json().get("items", [])]
        return result

    # ----- identities for tests (RBAC) -----

    def kubeconfig_for_user(self, user: str, groups: Sequence[str] = (), namespace: str = "default") -> Path:
        """A kubeconfig authenticating as `user` in `groups` by a client cert the cluster CA signed."""
        state = self._require_state()
        cert, key = pki.client_cert(self.layout.pki, user, groups)
        text = pki.kubeconfig(
            Ports(**state["ports"]).server,
            self.layout.pki.ca_cert.read_bytes(),
            user,
            cert_pem=cert,
            key_pem=key,
            namespace=namespace,
        )
        return pki.write_kubeconfig(self.layout.users_dir / f"{_safe_name(user)}.kubeconfig", text)

    def kubeconfig_for_serviceaccount(self, namespace: str, name: str, expiration_seconds: int = 86400) -> Path:
        """A kubeconfig with a real bound token for ServiceAccount `namespace/name` (TokenRequest API); the
        ServiceAccount must exist."""
        state = self._require_state()
        ports = Ports(**state["ports"])
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": expiration_seconds},
        }
        resp = self._api(ports).call("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token", body)
        if resp.status != 201:
            raise ClusterError(
                "kube-apiserver", f"TokenRequest for {namespace}/{name} failed: {resp.status} {resp.body[:300]!r}"
            )
        user = f"system:serviceaccount:{namespace}:{name}"
        text = pki.kubeconfig(
            ports.server,
            self.layout.pki.ca_cert.read_bytes(),
            user,
            token=resp.json()["status"]["token"],
            namespace=namespace,
        )
        return pki.write_kubeconfig(
            self.layout.users_dir / f"sa-{_safe_name(namespace)}-{_safe_name(name)}.kubeconfig", text
        )

    # ----- internals -----

    def _say(self, text: str) -> None:
        try:
            self._echo(f"[cluster +{time.monotonic() - self._t0:6.1f}s] {text}")
        except (OSError, ValueError):  # a closed or broken progress stream must not abort startup or cleanup
            pass

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.layout.root.mkdir(parents=True, exist_ok=True)
        with open(self.layout.lock_file, "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _load_state(self) -> dict | None:
        try:
            state = json.loads(self.layout.state_file.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None
        return state if state.get("version") == STATE_VERSION else None

    def _require_state(self) -> dict:
        state = self._load_state()
        if state is None:
            raise ClusterError("cluster", f"no cluster in {self.layout.root}: run `duplex-dev cluster up`")
        return state

    def _save_state(self, state: dict) -> None:
        tmp = self.layout.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2) + "\n")
        tmp.replace(self.layout.state_file)

    def _api(self, ports: Ports) -> rest.APIClient:
        p = self.layout.pki
        return rest.APIClient(ports.server, p.ca_cert, p.admin_cert, p.admin_key)

    def _healthy(self, name: str, ports: Ports, api: rest.APIClient | None) -> bool:
        if name == "kube-apiserver":
            return api is not None and api.ready()
        return rest.probe(components.health_url(name, ports))

    def _launch(self, state: dict, name: str, ports: Ports, bin_dir: Path) -> None:
        argv = components.argv(name, self.layout, ports, bin_dir, Network(**state.get("network", {})))
        record = processes.spawn(argv, self.layout.log(name))
        state["processes"][name] = record.to_json()
        self._save_state(state)
        self._write_pid_file(name, record)
        self._say(f"{name} started (pid {record.pid}), log {record.log}")

    def _write_pid_file(self, name: str, record: ProcessRecord) -> None:
        path = self.layout.pid_file(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{record.pid}\n")

    def _await_component(self, state: dict, name: str, ports: Ports, deadline: float) -> None:
        record = ProcessRecord.from_json(state["processes"][name])
        budget = min(BUDGETS[name], max(0.0, deadline - time.monotonic()))
        until = time.monotonic() + budget
        api = self._api(ports) if name == "kube-apiserver" else None
        while True:
            if not processes.is_alive(record):
                code = processes.exit_code(record)
                raise ClusterError(
                    name,
                    f"exited{'' if code is None else f' with code {code}'} during startup",
                    processes.log_tail(record.log),
                    record.log,
                )
            if self._healthy(name, ports, api):
                self._say(f"{name} healthy")
                return
            if time.monotonic() >= until:
                raise ClusterError(
                    name,
                    f"not healthy after {budget:.0f}s ({components.health_url(name, ports)})",
                    processes.log_tail(record.log),
                    record.log,
                )
            time.sleep(0.25)

    def _register_nodes(self, deadline: float) -> None:
        state = self._require_state()
        api = self._api(Ports(**state["ports"]))
        docs = [d for d in yaml.safe_load_all(self.nodes_file.read_text()) if d]
        names = []
        for doc in docs:
            resp = api.call("POST", "/api/v1/nodes", doc)
            if resp.status not in (201, 409):
                raise ClusterError(
                    "nodes", f"creating node {doc['metadata']['name']} failed: {resp.status} {resp.body[:500]!r}"
                )
            names.append(doc["metadata"]["name"])
        self._say(f"registered {len(names)} fake nodes from {self.nodes_file}")
        budget = min(BUDGETS["nodes"], max(0.0, deadline - time.monotonic()))
        until = time.monotonic() + budget
        pending: list[str] = names
        while True:
            with contextlib.suppress(OSError, TimeoutError):
                resp = api.get("/api/v1/nodes")
                if resp.status == 200:
                    by_name = {n["metadata"]["name"]: _node_summary(n) for n in resp.json()["items"]}
                    pending = [
                        n
                        for n in names
                        if n not in by_name
                        or not by_name[n]["ready"]
                        or any(t in NOT_READY_TAINTS for t in by_name[n]["taints"])
                    ]
                    if not pending:
                        self._say(f"nodes Ready and schedulable: {', '.join(names)}")
                        return
            if time.monotonic() >= until:
                raise ClusterError(
                    "nodes",
                    f"not Ready/schedulable after {budget:.0f}s: {', '.join(pending)} "
                    "(kwok drives node status; see its log)",
                    processes.log_tail(self.layout.log("kwok")),
                    self.layout.log("kwok"),
                )
            time.sleep(0.5)

    def _await_default_serviceaccount(self, deadline: float) -> None:
        state = self._require_state()
        api = self._api(Ports(**state["ports"]))
        budget = min(BUDGETS["serviceaccount"], max(0.0, deadline - time.monotonic()))
        until = time.monotonic() + budget
        while True:
            with contextlib.suppress(OSError, TimeoutError):
                if api.get("/api/v1/namespaces/default/serviceaccounts/default").status == 200:
                    self._say("ServiceAccount default/default exists (controller-manager works)")
                    return
            if time.monotonic() >= until:
                log = self.layout.log("kube-controller-manager")
                raise ClusterError(
                    "kube-controller-manager",
                    f"no default ServiceAccount after {budget:.0f}s",
                    processes.log_tail(log),
                    log,
                )
            time.sleep(0.5)

    def _real_node(self, name: str, slot: int) -> RealNode:
        return RealNode(self.layout.node_dir_of(name), NodeAddresses(slot), self._say, name)

    def _wire_nodes(self, count: int) -> list[RealNode]:
        """Claim a slot per node, wire each to the host and join them; none without `count`."""
        nodes: list[RealNode] = []
        try:
            for index in range(count):
                addrs = hostnet.claim_slot()
                nodes.append(self._real_node(node_name(index), addrs.slot))
                # Recorded at once, so that a failure from here on is undone by `down` like the processes are.
                entries = [{"name": n.name, "slot": n.addrs.slot} for n in nodes]
                self._save_state({"version": STATE_VERSION, "nodes": entries, "processes": {}})
                hostnet.wire(addrs, services=index == 0)
                self._say(
                    f"real node {nodes[-1].name}: slot {addrs.slot}, namespace {addrs.netns}, link {addrs.host_link} "
                    f"{addrs.host} <-> {addrs.node}, pods {addrs.pod_cidr}"
                    + (f", Services {addrs.service_cidr}" if index == 0 else "")
                )
            hostnet.join([n.addrs for n in nodes])
        except BaseException:
            for node in nodes:
                hostnet.unwire(node.addrs)
            self._remove_runtime()
            raise
        return nodes

    def _start_nodes(self, state: dict, nodes: list[RealNode], bin_dir: Path, deadline: float) -> None:
        """Each daemon on every node at once, then the next: the nodes start in about the time of one."""
        binaries = tools.node_binaries(bin_dir)
        for node in nodes:
            node.write_config(self.layout.pki, Ports(**state["ports"]).server)
        save_sysctls()
        for name in NODE_COMPONENTS:
            started = []
            for node in nodes:
                key = node.key(name)
                record = node.launch(name, binaries, self.layout.log(key))
                state["processes"][key] = record.to_json()
                self._save_state(state)
                self._say(f"{key} started (pid {record.pid}) in {node.addrs.netns}, log {record.log}")
                started.append((node, record))
            for node, record in started:
                self._await_node_component(node, name, record, deadline)
                if name == "containerd":
                    pause = node.import_image(binaries, tools.pause_archive())
                    self._say(f"pause image on {node.name}: {pause}")
        for node in nodes:
            self._await_real_node_ready(node.name, deadline)

    def _await_node_component(self, node: RealNode, name: str, record: ProcessRecord, deadline: float) -> None:
        until = time.monotonic() + min(BUDGETS[name], max(0.0, deadline - time.monotonic()))
        while not node.healthy(name):
            if not processes.is_alive(record):
                raise ClusterError(name, "exited during startup", processes.log_tail(record.log), record.log)
            if time.monotonic() >= until:
                raise ClusterError(name, "not healthy in time", processes.log_tail(record.log), record.log)
            time.sleep(0.25)
        self._say(f"{node.key(name)} healthy")

    def _await_real_node_ready(self, name: str, deadline: float) -> None:
        api = self._api(Ports(**self._require_state()["ports"]))
        until = time.monotonic() + min(BUDGETS["real node"], max(0.0, deadline - time.monotonic()))
        while True:
            with contextlib.suppress(OSError, TimeoutError):
                resp = api.get(f"/api/v1/nodes/{name}")
                if resp.status == 200 and _node_summary(resp.json())["ready"]:
                    self._say(f"node {name} Ready: pods on it really run")
                    return
            if time.monotonic() >= until:
                log = self.layout.log("kubelet" if name == NODE_NAME else f"{name}/kubelet")
                raise ClusterError("kubelet", f"node {name} not Ready in time", processes.log_tail(log), log)
            time.sleep(0.5)

    def _stop_all(self, state: dict) -> list[str]:
        stopped: list[str] = []
        stuck: list[str] = []
        nodes = [self._real_node(entry["name"], entry["slot"]) for entry in _node_entries(state)]
        recorded = state.get("processes", {})
        # Every node's pods stop before any node's routes go (RealNode.stop_processes says why).
        left: list[str] = []
        for node in nodes:
            records = {
                c: ProcessRecord.from_json(recorded[node.key(c)]) for c in NODE_COMPONENTS if node.key(c) in recorded
            }
            left += [f"{node.name}: {what}" for what in node.stop_processes(records)]
            stopped += [node.key(c) for c in records]
        for node in nodes:
            node.unwire()
        left += [f"{node.name}: {what}" for node in nodes for what in node.leftovers()]
        if left:
            raise ClusterError("real node", f"left behind after stopping: {'; '.join(left)}")
        for node in nodes:
            node.remove_files()
            self._say(
                f"real node {node.name} stopped: no process, mount, cgroup, namespace or route of it is left "
                f"(slot {node.addrs.slot})"
            )
        for name in reversed(COMPONENTS):
            data = state.get("processes", {}).get(name)
            if data is None:
                continue
            record = ProcessRecord.from_json(data)
            was_alive = processes.is_alive(record)
            if processes.stop(record):
                if was_alive:
                    stopped.append(name)
                    self._say(f"{name} (pid {record.pid}) stopped")
            else:
                stuck.append(f"{name} (pid {record.pid})")
        if stuck:
            raise ClusterError("cluster", f"still running after SIGKILL: {', '.join(stuck)}")
        return stopped

    def _remove_runtime(self) -> None:
        for path in self.layout.runtime_paths():
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)

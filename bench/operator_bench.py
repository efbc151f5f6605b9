"""The operator at scale on the real local control plane (etcd, kube-apiserver with its audit log, controller-manager,
scheduler, kwok nodes): for each size, a fresh `duplex operator` under the chart's ClusterRole, N
DisaggregatedServings created as fast as the client can, then an idle window.

    python bench/operator_bench.py            # sizes 10,50,100,200, 300 idle seconds each (~30 min);
                                              # bench/results/operator-<date>.{md,json}
    python bench/operator_bench.py --quick    # sizes 5,10, 30 idle seconds (a few minutes); results go to
                                              # bench/results/tmp/operator-<date>-quick.* (ignored by git)

Per size it measures: the time until every serving is Ready; per serving, create-returned to all three child
Deployments seen on a watch; the operator's requests over the idle window from the audit log (per resync period,
writes among them); the operator's CPU seconds and RSS from /proc. See docs/benchmarks.md ("Operator benchmark").
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
sys.path.insert(0, BENCH)

import operator_fleet as fleet
import operator_report
import operator_stats as stats
import procstat
import results_io
from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException

from duplex_dev.cluster import LocalCluster
from duplex_dev.launch.operator import OPERATOR_USER, OperatorProcess, install_crd_and_rbac, operator_requests

GROUP, VERSION, PLURAL = "duplex.dev", "v1alpha1", "disaggregatedservings"
SERVING_LABEL = "duplex.dev/serving"
ROLES = ("prefill", "decode", "router")
# Watched by the operator before it can act: the parents, the children that decide Ready, the engine pods.
WATCHED_FIRST = {PLURAL, "deployments", "pods"}
MiB = 2**20

_T0 = time.monotonic()


def say(msg: str) -> None:
    print(f"[{time.monotonic() - _T0:7.1f}s] {msg}", flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="sizes 5,10, 30 idle seconds, 10 s resync")
    p.add_argument("--sizes", help="servings per run, comma-separated (default 10,50,100,200; quick 5,10)")
    p.add_argument("--idle-seconds", type=float, help="idle window after all are Ready (default 300; quick 30)")
    p.add_argument("--resync-seconds", type=float, help="the operator's resync period (default 60, its own; quick 10)")
    p.add_argument("--probes", type=int, default=10, help="servings then created one at a time (default 10)")
    p.add_argument("--clients", type=int, default=4, help="threads creating the servings (default 4)")
    p.add_argument("--workers", type=int, help="the operator's --workers (default: its own, 8)")
    p.add_argument("--ready-timeout", type=float, default=600.0, help="give up waiting for Ready after this")
    p.add_argument("--out", help="results stem (default bench/results/operator-<date>[-quick])")
    args = p.parse_args(argv)
    q = args.quick
    args.sizes = [int(x) for x in (args.sizes or ("5,10" if q else "10,50,100,200")).split(",") if x.strip()]
    args.idle_seconds = args.idle_seconds if args.idle_seconds is not None else (30.0 if q else 300.0)
    args.resync_seconds = args.resync_seconds or (10.0 if q else 60.0)
    return args


class FirstSeen:
    """Each object's first moment (monotonic) in a state, from one watch stream in a thread of its own."""

    def __init__(self, list_fn: Callable[..., Any], reached: Callable[[dict[str, Any]], str | None], **kw: Any):
        self.at: dict[str, float] = {}
        self._list_fn, self._reached, self._kw = list_fn, reached, kw
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> FirstSeen:
        self._thread.start()
        self._ready.wait(30)
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(15)

    def _run(self) -> None:
        rv = self._list_fn(**self._kw)["metadata"]["resourceVersion"]  # from now on: nothing exists yet
        self._ready.set()
        while not self._stop.is_set():
            try:
                stream = watch.Watch().stream(self._list_fn, resource_version=rv, timeout_seconds=5, **self._kw)
                for ev in stream:
                    obj = ev["object"]
                    rv = obj["metadata"]["resourceVersion"]
                    if ev["type"] in ("ADDED", "MODIFIED"):
                        key = self._reached(obj)
                        if key is not None:
                            self.at.setdefault(key, time.monotonic())
                    if self._stop.is_set():
                        break
            except ApiException as err:
                if err.status != 410:
                    say(f"watch error {err.status}; resuming")
                    time.sleep(1)
                else:
                    rv = self._list_fn(**self._kw)["metadata"]["resourceVersion"]


def deployment_key(obj: dict[str, Any]) -> str | None:
    """ "<serving>/<role>" for a child Deployment."""
    labels = obj["metadata"].get("labels") or {}
    serving, role = labels.get(SERVING_LABEL), labels.get("duplex.dev/role")
    return f"{serving}/{role}" if serving and role else None


def ready_key(obj: dict[str, Any]) -> str | None:
    """The serving's name once its Ready condition is True for its current generation."""
    status = obj.get("status") or {}
    current = status.get("observedGeneration") == obj["metadata"].get("generation")
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
    return obj["metadata"]["name"] if current and ready else None


def operator_usage(op: OperatorProcess) -> dict[str, float]:
    """CPU seconds, RSS and peak RSS (MiB) of the operator's process group."""
    pids = procstat.group_pids(op.pid or 0)
    return {
        "cpu_s": sum(procstat.cpu_seconds(p) for p in pids),
        "rss_mib": sum(procstat.rss_bytes(p) for p in pids) / MiB,
        "peak_mib": sum(procstat.rss_bytes(p, "VmHWM") for p in pids) / MiB,
    }


def cpu_by_process(cluster: LocalCluster, op: OperatorProcess) -> dict[str, float]:
    """CPU seconds so far of each control-plane component and of the operator: where a burst's cores went."""
    out = {
        c.name: procstat.cpu_seconds(c.pid) for c in cluster.status(with_nodes=False).components if c.alive and c.pid
    }
    out["operator"] = operator_usage(op)["cpu_s"]
    return out


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.5) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)
    return True


def operator_watching(audit: Path, since: float) -> bool:
    watched = {(ev.get("objectRef") or {}).get("resource") for ev in operator_requests(audit, since)}
    return watched >= WATCHED_FIRST


def quiet_for(audit: Path, seconds: float) -> bool:
    """No operator write in the last `seconds` (status settling after the last pods turned ready)."""
    recent = operator_requests(audit, time.time() - seconds)
    return not [ev for ev in recent if ev.get("verb") in stats.WRITE_VERBS]


def run_size(n: int, cluster: LocalCluster, api: client.ApiClient, args: argparse.Namespace, work: Path) -> dict:
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    audit, ns = cluster.audit_log_path, f"opbench-{n}"
    core.create_namespace({"metadata": {"name": ns}})
    wait_until(lambda: bool(core.list_namespaced_service_account(ns).items), 60)
    op = OperatorProcess(
        cluster.kubeconfig_for_user(OPERATOR_USER), work, resync_seconds=args.resync_seconds, workers=args.workers
    )
    since = time.time()
    op.start()
    row: dict[str, Any] = {"servings": n, "namespace": ns}
    try:
        if not wait_until(lambda: operator_watching(audit, since), 180, 1.0):
            raise RuntimeError(f"the operator did not start watching in 180 s:\n{op.log_tail()}")
        row["started"] = operator_usage(op)
        say(f"{n}: operator watching ({row['started']['rss_mib']:.0f} MiB); creating {n} servings")
        deployments = FirstSeen(
            custom.list_namespaced_custom_object, deployment_key, group="apps", version="v1",
            namespace=ns, plural="deployments", label_selector="app.kubernetes.io/managed-by=duplex",
        ).start()  # fmt: skip
        readiness = FirstSeen(
            custom.list_namespaced_custom_object, ready_key, group=GROUP, version=VERSION, namespace=ns, plural=PLURAL
        ).start()
        created: dict[str, float] = {}

        def create(name: str) -> None:
            custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, fleet.serving(name, ns))
            created[name] = time.monotonic()

        names = [f"s-{i:03d}" for i in range(n)]
        cpu0 = cpu_by_process(cluster, op)
        wall0, t0 = time.time(), time.monotonic()
        with ThreadPoolExecutor(args.clients) as pool:
            list(pool.map(create, names))
        row["create_s"] = time.monotonic() - t0
        all_ready = wait_until(lambda: len(readiness.at) >= n, args.ready_timeout)
        burst_wall = time.monotonic() - t0
        cpu1 = cpu_by_process(cluster, op)
        row["burst_cpu"] = {"wall_s": burst_wall, **{k: cpu1[k] - cpu0.get(k, 0.0) for k in cpu1}}
        deployments.stop()
        readiness.stop()
        row["converged"] = operator_usage(op)
        children = {
            name: max(deployments.at[f"{name}/{r}"] for r in ROLES)
            for name in names
            if all(f"{name}/{r}" in deployments.at for r in ROLES)
        }
        row["children_s"] = stats.spread(stats.latencies(created, children).values())
        row["ready_s"] = stats.spread(stats.latencies(created, readiness.at).values())
        row["ready"] = len(readiness.at)
        row["all_ready_s"] = max(readiness.at.values()) - t0 if all_ready else None
        converge = stats.classify(operator_requests(audit, wall0, time.time()))
        row["converge_requests"] = {**converge, "per_serving": converge["requests"] / n}
        say(
            f"{n}: {row['ready']}/{n} Ready in {row['all_ready_s'] or float('nan'):.1f} s; children p50 "
            f"{row['children_s']['p50']:.2f} s p99 {row['children_s']['p99']:.2f} s; "
            f"{converge['writes']} writes to converge"
        )
        busy = sorted(((v, k) for k, v in row["burst_cpu"].items() if k != "wall_s"), reverse=True)
        say(
            f"{n}: CPU over the burst's {burst_wall:.0f} s ({os.cpu_count()} cores): "
            + ", ".join(f"{k} {v:.0f} s" for v, k in busy)
        )
        wait_until(lambda: quiet_for(audit, 5.0), 120, 1.0)
        passes0 = op.metric("duplex_reconciles_total", result="ok")
        before = operator_usage(op)
        idle0 = time.time()
        time.sleep(args.idle_seconds)  # the observation window
        idle1 = time.time()
        row["idle_end"] = after = operator_usage(op)
        passes = op.metric("duplex_reconciles_total", result="ok") - passes0
        row["idle"] = stats.idle_summary(
            operator_requests(audit, idle0, idle1), idle1 - idle0, args.resync_seconds, passes, n
        )
        row["idle_cpu_pct"] = 100 * (after["cpu_s"] - before["cpu_s"]) / (idle1 - idle0)
        row["converge_cpu_s"] = row["converged"]["cpu_s"] - row["started"]["cpu_s"]
        row["rss_mib"] = {
            "converged": row["converged"]["rss_mib"],
            "idle_end": after["rss_mib"],
            "peak": after["peak_mib"],
        }
        say(
            f"{n}: idle {args.idle_seconds:.0f} s: {row['idle']['requests']} requests "
            f"({row['idle']['resumed_watches']} resumed watches), {row['idle']['writes']} writes, "
            f"{passes:.0f} passes; CPU {row['idle_cpu_pct']:.1f}% of a core; RSS {after['rss_mib']:.0f} MiB"
        )
        row["single_children_s"] = stats.spread(probe_applies(custom, ns, args.probes))
        say(
            f"{n}: one at a time beside them: children p50 {row['single_children_s']['p50']:.2f} s "
            f"p99 {row['single_children_s']['p99']:.2f} s"
        )
    finally:
        op.stop()
    return row


def probe_applies(custom: client.CustomObjectsApi, ns: str, count: int) -> list[float]:
    """Apply-to-children of `count` more servings created one at a time (each after the previous one's children
    exist), beside the N already converged: the latency of a single apply, without the burst's queue."""
    deployments = FirstSeen(
        custom.list_namespaced_custom_object, deployment_key, group="apps", version="v1",
        namespace=ns, plural="deployments", label_selector="app.kubernetes.io/managed-by=duplex",
    ).start()  # fmt: skip
    out = []
    try:
        for i in range(count):
            name = f"probe-{i:02d}"
            custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, fleet.serving(name, ns))
            created = time.monotonic()
            if wait_until(lambda: all(f"{name}/{r}" in deployments.at for r in ROLES), 60, 0.02):  # noqa: B023
                out.append(max(deployments.at[f"{name}/{r}"] for r in ROLES) - created)
    finally:
        deployments.stop()
    return out


def delete_namespace(core: client.CoreV1Api, ns: str, timeout: float) -> bool:
    core.delete_namespace(ns)

    def gone() -> bool:
        try:
            core.read_namespace(ns)
        except ApiException as err:
            return err.status == 404
        return False

    return wait_until(gone, timeout, 2.0)


def kubectl(cluster: LocalCluster) -> Callable[..., str]:
    def run(*args: str, input: str | None = None) -> str:
        argv = [str(cluster.kubectl), f"--kubeconfig={cluster.kubeconfig}", *args]
        return subprocess.run(argv, input=input, capture_output=True, text=True, check=True).stdout

    return run


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # tear the cluster down and write what was measured
    command = " ".join(
        ["python", "bench/operator_bench.py", *map(shlex.quote, argv if argv is not None else sys.argv[1:])]
    )
    date = dt.date.today().isoformat()
    where = os.path.join(results_io.RESULTS, "tmp") if args.quick else results_io.RESULTS
    stem = args.out or os.path.join(where, f"operator-{date}{'-quick' if args.quick else ''}")
    work = Path(tempfile.mkdtemp(prefix="opbench-"))
    gpu_nodes, cpu_nodes = fleet.node_counts(max(args.sizes))
    results: dict[str, Any] = {
        "command": command,
        "machine": procstat.machine_facts(ROOT),
        "started": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "load_before": os.getloadavg(),
        "sizes": args.sizes,
        "idle_seconds": args.idle_seconds,
        "resync_seconds": args.resync_seconds,
        "clients": args.clients,
        "workers": args.workers,
        "probes": args.probes,
        "nodes": {"p5en.48xlarge": gpu_nodes, "m7i.4xlarge": cpu_nodes},
        "serving": fleet.serving("s-000", "opbench")["spec"],
        "rows": [],
        "complete": False,
    }
    cluster = LocalCluster(work / "cluster", nodes_file=fleet.write_fleet(max(args.sizes), work / "nodes.yaml"))
    try:
        say(f"local control plane with {gpu_nodes} p5en and {cpu_nodes} m7i fake nodes in {work}")
        cluster.up(timeout=300)
        install_crd_and_rbac(kubectl(cluster))
        api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
        for i, n in enumerate(args.sizes):
            results["rows"].append(run_size(n, cluster, api, args, work))
            if i + 1 < len(args.sizes):
                say(f"{n}: deleting namespace opbench-{n}")
                if not delete_namespace(client.CoreV1Api(api), f"opbench-{n}", 600):
                    say("the namespace is still terminating after 600 s; going on")
        results["complete"] = True
    finally:
        cluster.down()
        results["finished"] = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
        results["load_after"] = os.getloadavg()
        results["wall_s"] = time.monotonic() - _T0
        if results["rows"]:
            operator_report.analyse(results)
            results_io.write(stem, results, operator_report.markdown(results))
            say(f"wrote {stem}.md and .json (operator logs in {work})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Run `duplex operator` as a subprocess against the local control plane, under the chart's ClusterRole, and read
what it asked the API server for from the audit log (the integration tests and bench/operator_bench.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import yaml

from duplex_dev.processes import free_port

ROOT = Path(__file__).resolve().parents[3]
OPERATOR_USER = "duplex-operator"
CLUSTER_ROLE = ROOT / "charts/duplex/files/clusterrole.yaml"
CRD = ROOT / "crds/duplex.dev_disaggregatedservings.yaml"
WRITE_VERBS = {"create", "update", "patch", "delete", "deletecollection"}


def install_crd_and_rbac(kubectl: Any) -> None:
    kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD))
    wait_established(kubectl, "disaggregatedservings.duplex.dev")
    kubectl("apply", "-f", str(CLUSTER_ROLE))
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "duplex-operator-test"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "duplex-operator"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": OPERATOR_USER}],
    }
    kubectl("apply", "-f", "-", input=yaml.safe_dump(binding))


def wait_established(kubectl: Any, crd: str, timeout: float = 60.0) -> None:
    """Until the CRD is Established. Polled, not `kubectl wait`: that fails at once on a CRD whose status has no
    conditions yet."""
    deadline = time.monotonic() + timeout
    while True:
        obj = json.loads(kubectl("get", f"crd/{crd}", "-o", "json"))
        conditions = (obj.get("status") or {}).get("conditions") or []
        if any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"CRD {crd} was not Established within {timeout:.0f} s")
        time.sleep(0.2)


class OperatorProcess:
    """One `duplex operator --all-namespaces` process with its own log; restartable."""

    def __init__(
        self,
        kubeconfig: Path,
        log_dir: Path,
        resync_seconds: float = 2.0,
        workers: int | None = None,
        flags: Sequence[str] = (),
    ) -> None:
        """`flags`: more of `duplex operator`'s flags, e.g. the policy's (--allow-host-path PREFIX)."""
        self.kubeconfig = kubeconfig
        self.log_path = log_dir / "operator.log"
        self.resync_seconds = resync_seconds
        self.workers = workers
        self.flags = tuple(flags)
        self.proc: subprocess.Popen[bytes] | None = None
        self.metrics_port = 0

    def start(self) -> None:
        self.metrics_port = free_port()
        argv = [
            sys.executable, "-m", "duplex.cli", "operator", "--all-namespaces",
            "--kubeconfig", str(self.kubeconfig), "--metrics-port", str(self.metrics_port), "--health-port", "0",
            "--resync-seconds", str(self.resync_seconds),
            *(["--workers", str(self.workers)] if self.workers else []),
            *self.flags,
        ]  # fmt: skip
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        with open(self.log_path, "ab") as log:  # the child keeps its own copy of the descriptor
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def kill(self) -> None:
        """SIGKILL: no graceful shutdown, as a crashed pod would get."""
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(60)
        self.proc = None

    def stop(self) -> None:
        """SIGTERM (kopf shuts down its watches and our workers), SIGKILL if that takes too long. The bounds are
        generous: on a loaded 2-core machine interpreter teardown alone has taken several seconds."""
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(60)
        self.proc = None

    @property
    def pid(self) -> int | None:
        """The operator's pid, which leads its own process group (started in a new session)."""
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def metric(self, name: str, **labels: str) -> float:
        """Sum of the operator's /metrics samples named `name` whose labels match."""
        from duplex_dev import processes

        return processes.metric_sum(processes.scrape(f"http://127.0.0.1:{self.metrics_port}/metrics"), name, **labels)

    def log_tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def operator_requests(audit_log: Path, since: float, until: float | None = None) -> list[dict[str, Any]]:
    """Every request the operator's identity made that the API server received in [since, until) (epoch seconds),
    one audit event per request: a watch's ResponseStarted (it may not have completed yet), else ResponseComplete."""
    first: dict[str, dict[str, Any]] = {}
    with open(audit_log, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            if OPERATOR_USER not in line:  # cheap: most lines are the control plane's own
                continue
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            if (ev.get("user") or {}).get("username") != OPERATOR_USER:
                continue
            if ev.get("stage") not in ("ResponseStarted", "ResponseComplete"):
                continue
            received = _epoch(ev.get("requestReceivedTimestamp", ""))
            if received < since or (until is not None and received >= until):
                continue
            first.setdefault(ev["auditID"], ev)
    return list(first.values())


def operator_writes(audit_log: Path, since: float, namespace: str | None = None) -> list[dict[str, Any]]:
    """Write requests the operator's identity made after `since` (epoch seconds), from the API server audit log."""
    return [
        ev
        for ev in operator_requests(audit_log, since)
        if ev.get("verb") in WRITE_VERBS
        and (not namespace or (ev.get("objectRef") or {}).get("namespace") == namespace)
    ]


def resource(ev: dict[str, Any]) -> str | None:
    """The request's resource ("deployments", "disaggregatedservings/status"), None for a non-resource URL."""
    ref = ev.get("objectRef") or {}
    if not ref.get("resource"):
        return None
    return ref["resource"] + (f"/{ref['subresource']}" if ref.get("subresource") else "")


def query(ev: dict[str, Any]) -> dict[str, list[str]]:
    return parse_qs(urlsplit(ev.get("requestURI", "")).query)


def _epoch(stamp: str) -> float:
    from datetime import datetime

    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0

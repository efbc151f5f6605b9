"""The NIXL checks: start nixl_probe in a child process with a deadline, then judge what it recorded. Two results:
`nixl_backend` (the backend's plugin loads and an agent comes up with it) and `loopback` (a verified READ whose
bandwidth clears the backend's floor)."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from duplex_sidecars.preflight.libfabric import EFA_INSTALLER
from duplex_sidecars.preflight.quantity import format_bytes
from duplex_sidecars.preflight.result import CheckResult, failed, passed, skipped, warned

BACKEND = "nixl_backend"
LOOPBACK = "loopback"

# Floors in GB/s (10^9 bytes/s) below which the path is broken, not merely slow (held against the fastest READ). They are the health heuristics of
# vLLM's NIXL metrics guide (docs/features/nixl_connector_metrics.md): above 1 GB/s on an RDMA fabric, above
# 100 MB/s over TCP. A loopback inside one pod moves memory without a wire (UCX picks cma or shared memory; EFA
# loops back through the device), so a healthy pod clears them many times over.
MIN_GBPS = {"UCX": 0.1, "LIBFABRIC": 1.0}
INSTALL_HINT = "pip install --no-deps nixl-cu12 (the version hack/versions.sh pins as NIXL_VERSION)"


@dataclass(frozen=True)
class ProbeRun:
    records: list[dict[str, Any]]
    returncode: int | None  # None: killed at the deadline
    stderr: str
    timeout_s: float

    def record(self, kind: str) -> dict[str, Any] | None:
        return next((r for r in self.records if r.get("kind") == kind), None)

    @property
    def last_stage(self) -> str:
        stages = [r["stage"] for r in self.records if "stage" in r]
        return stages[-1] if stages else "starting Python"


def run_probe(backend: str, size: int, iterations: int, timeout_s: float) -> ProbeRun:
    """Run nixl_probe in a child Python with this package importable, killing it at the deadline."""
    package_parent = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH", "")) if p)
    with tempfile.TemporaryDirectory(prefix="duplex-preflight-") as tmp:
        out = Path(tmp) / "probe.jsonl"
        err = Path(tmp) / "probe.stderr"
        argv = [sys.executable, "-m", "duplex_sidecars.preflight.nixl_probe", "--backend", backend,
                "--size", str(size), "--iterations", str(iterations), "--out", str(out)]  # fmt: skip
        with err.open("wb") as err_f:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=err_f, stderr=err_f, env=env)
            try:
                rc: int | None = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                rc = None
        records = []
        if out.exists():
            for line in out.read_text().splitlines():
                try:
                    records.append(json.loads(line))
                except ValueError:  # the line a killed child was writing
                    continue
        return ProbeRun(records, rc, err.read_text(errors="replace"), timeout_s)


def _log_tail(stderr: str, lines: int = 6) -> list[str]:
    """NIXL's warnings and errors (glog's W/E lines and Python's WARNING/ERROR), the last few."""
    keep = [ln.strip() for ln in stderr.splitlines() if ln[:1] in ("E", "W", "F") or "ERROR" in ln or "WARN" in ln]
    return keep[-lines:]


def _efa_hint(backend: str) -> str:
    if backend != "LIBFABRIC":
        return ""
    return (
        f" The LIBFABRIC backend needs libfabric with the efa provider (the EFA installer's, {EFA_INSTALLER}/lib "
        "first on LD_LIBRARY_PATH) and EFA devices in the pod (vpc.amazonaws.com/efa in requests and limits)."
    )


def _unfinished(run: ProbeRun, name: str, backend: str) -> CheckResult:
    tail = _log_tail(run.stderr)
    if run.returncode is None:
        what = f"timed out after {run.timeout_s:.0f}s while {run.last_stage}"
        why = " (LIBFABRIC hangs this way after falling back to tcp/sockets without EFA devices)"
        message = what + (why if backend == "LIBFABRIC" else "") + "."
    else:
        what = f"the probe exited {run.returncode} while {run.last_stage}"
        message = what + (f": {tail[-1]}" if tail else "") + "."
    return failed(name, what, message + _efa_hint(backend), log_tail=tail)


def judge_backend(run: ProbeRun, backend: str) -> CheckResult:
    rec = run.record("backend")
    if rec is None:
        return _unfinished(run, BACKEND, backend)
    nixl = rec.get("nixl", "nixl")
    data: dict[str, Any] = {k: rec[k] for k in ("nixl", "plugin_dirs", "plugins", "mapped", "plugin") if k in rec}
    data["log_tail"] = _log_tail(run.stderr)
    if rec.get("ok"):
        mapped = rec.get("mapped", {})
        value = f"{backend} instantiated ({nixl})"
        if backend == "LIBFABRIC":
            lib = mapped.get("libfabric.so", "")
            value += f", libfabric {lib or 'not mapped'}"
            if lib and not lib.startswith(EFA_INSTALLER) and Path(EFA_INSTALLER).is_dir():
                return warned(
                    BACKEND,
                    value,
                    f"NIXL's LIBFABRIC plugin loaded {lib}, not the EFA installer's libfabric in {EFA_INSTALLER}: "
                    "a plugin built against another libfabric loses RDMA silently; put "
                    f"{EFA_INSTALLER}/lib first on LD_LIBRARY_PATH",
                    **data,
                )
        return passed(BACKEND, value, **data)
    reason = rec.get("reason")
    if reason == "import":
        return failed(
            BACKEND,
            "nixl not importable",
            f"NIXL's Python package is not importable in this image ({rec.get('error', '')}): {INSTALL_HINT}",
            **data,
        )
    dirs = ", ".join(rec.get("plugin_dirs", [])) or "no plugin directory found"
    if reason == "no_plugin":
        return failed(
            BACKEND,
            f"no {backend} plugin",
            f"NIXL ({nixl}) has no {backend} plugin (libplugin_{backend}.so) in {dirs}; it has "
            f"{', '.join(rec.get('plugins', [])) or 'none'}: use a NIXL build with the {backend} plugin, or point "
            "NIXL_PLUGIN_DIR at it." + _efa_hint(backend),
            **data,
        )
    loader = rec.get("dlopen_error", "")
    if loader:
        cause = f"its plugin {rec.get('plugin', '')} does not load: {loader}"
    else:
        tail = data["log_tail"]
        cause = f"{rec.get('error', 'unknown error')}" + (f" ({tail[-1]})" if tail else "")
    return failed(
        BACKEND,
        f"{backend} did not start",
        f"NIXL ({nixl}) could not instantiate the {backend} backend: {cause}." + _efa_hint(backend),
        **data,
    )


def judge_loopback(run: ProbeRun, backend: str, min_gbps: float) -> CheckResult:
    backend_rec = run.record("backend")
    if backend_rec is None or not backend_rec.get("ok"):
        return skipped(LOOPBACK, "not run", f"the {backend} backend did not come up (see {BACKEND})")
    rec = run.record("loopback")
    if rec is None:
        return _unfinished(run, LOOPBACK, backend)
    if not rec.get("ok"):
        stage = rec.get("stage", "")
        value = "bytes differ" if stage == "verify" else f"failed at {stage}"
        return failed(
            LOOPBACK,
            value,
            f"a NIXL {backend} READ between two agents in this pod failed at {stage}: {rec.get('error', '')}."
            + _efa_hint(backend),
            log_tail=_log_tail(run.stderr),
        )
    size, seconds, small = rec["bytes"], rec["seconds"], rec["small_seconds"]
    gbps = size * len(seconds) / sum(seconds) / 1e9
    # The floor is held against the fastest READ: a broken path (a transport fallback) is slow on every one, while
    # neighbours competing for the CPU slow some; an init container should not fail a pod for its neighbours.
    best_gbps = size / min(seconds) / 1e9
    p50_ms = statistics.median(seconds) * 1e3
    small_p50_us = statistics.median(small) * 1e6
    data = {
        "bytes": size,
        "iterations": len(seconds),
        "gbps": round(gbps, 3),
        "best_gbps": round(best_gbps, 3),
        "min_gbps": min_gbps,
        "transfer_ms_p50": round(p50_ms, 3),
        "small_read_bytes": rec["small_bytes"],
        "small_read_us_p50": round(small_p50_us, 1),
        "verified": bool(rec.get("verified")),
        "via": rec.get("via", backend),
    }
    value = (
        f"{gbps:.2f} GB/s ({len(seconds)} READs of {format_bytes(size)}, p50 {p50_ms:.1f} ms), "
        f"{format_bytes(rec['small_bytes'])} READ p50 {small_p50_us:.0f} us, bytes verified"
    )
    if best_gbps < min_gbps:
        return failed(
            LOOPBACK,
            value,
            f"even the fastest READ ({best_gbps:.2f} GB/s) is below the {backend} floor of {min_gbps:g} GB/s: a "
            "loopback inside the pod has no "
            "wire to blame, so the memory path is broken (transport fallback, CPU starvation, or pages not pinned); "
            "see the backend's log with NIXL_LOG_LEVEL=debug"
            + (" FI_LOG_LEVEL=debug" if backend == "LIBFABRIC" else ""),
            **data,
        )
    return passed(LOOPBACK, value, **data)


def check(backend: str, size: int, iterations: int, min_gbps: float, timeout_s: float) -> list[CheckResult]:
    run = run_probe(backend, size, iterations, timeout_s)
    return [judge_backend(run, backend), judge_loopback(run, backend, min_gbps)]

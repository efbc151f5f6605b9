"""The real `duplex preflight` on this machine: NIXL over UCX moves verified bytes and passes; LIBFABRIC, with no EFA
here, fails and says EFA; the termination log is JSON within the kubelet's 4096 bytes.

A missing nixl package fails these tests (in CI and locally): the NIXL checks are what the preflight is for.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from duplex_sidecars.preflight import nixl_probe

pytestmark = [pytest.mark.nixl, pytest.mark.timeout(300)]

KUBELET_LIMIT = 4096


@pytest.fixture(scope="module", autouse=True)
def nixl_installed() -> None:
    try:
        nixl_probe.load_api()
    except ImportError as e:
        pytest.fail(f"nixl is required for the preflight's NIXL tier (CI and local): run hack/setup.sh ({e})")


def duplex_command() -> list[str]:
    script = Path(sys.executable).parent / "duplex"  # the console script pip installed beside this interpreter
    return [str(script)] if script.exists() else [sys.executable, "-m", "duplex.cli"]


def preflight(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> tuple[int, dict[str, Any], str, bytes]:
    """Run the command; returns (exit code, the JSON report on stdout, stderr, the termination log's bytes)."""
    term = tmp_path / "termination-log"
    proc = subprocess.run(
        [*duplex_command(), "preflight", "--termination-log", str(term), *args],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, **(env or {})},
        check=False,
    )
    assert proc.stdout, proc.stderr
    return proc.returncode, json.loads(proc.stdout), proc.stderr, term.read_bytes()


def by_name(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in report["checks"]}


def test_ucx_passes_with_verified_bytes_and_a_bandwidth(tmp_path: Path) -> None:
    rc, report, err, term = preflight(tmp_path, "--backend", "UCX")
    assert rc == 0, err
    checks = by_name(report)
    loop = checks["loopback"]
    assert loop["status"] == "pass", err
    assert loop["data"]["verified"] is True and loop["data"]["bytes"] == 64 << 20 and loop["data"]["iterations"] == 8
    assert loop["data"]["best_gbps"] > loop["data"]["min_gbps"] == 0.1 and loop["data"]["gbps"] > 0
    assert loop["data"]["small_read_us_p50"] > 0
    assert checks["nixl_backend"]["status"] == "pass" and "UCX instantiated" in checks["nixl_backend"]["value"]
    # No EFA here, and none needed: the EFA checks say they were skipped, and why.
    assert checks["efa_devices"]["status"] == "skip"
    assert "EFA is not required with the UCX backend" in err
    assert "PASS  loopback" in err and err.rstrip().splitlines()[-1].startswith("preflight PASS")
    assert len(term) < KUBELET_LIMIT
    compact = json.loads(term)
    assert compact["version"] == 1 and compact["ok"] is True and compact["backend"] == "UCX"
    assert {c["name"]: c["status"] for c in compact["checks"]} == {c["name"]: c["status"] for c in report["checks"]}


def test_libfabric_fails_here_and_names_efa(tmp_path: Path) -> None:
    # What the operator renders for an EFA pod, on a machine without EFA.
    rc, report, err, term = preflight(
        tmp_path, "--backend", "LIBFABRIC", "--efa-devices", "16", "--hugepages", "5120Mi"
    )
    assert rc == 1
    checks = by_name(report)
    efa = checks["efa_devices"]
    assert efa["status"] == "fail" and efa["value"] == "0 of 16"
    assert "EFA device plugin" in efa["message"] and "vpc.amazonaws.com/efa: 16" in efa["message"]
    assert checks["nixl_backend"]["status"] == "fail" and "EFA" in checks["nixl_backend"]["message"]
    assert checks["loopback"]["status"] == "skip"
    assert "FAIL  efa_devices" in err and "EFA devices" in err
    assert len(term) < KUBELET_LIMIT
    compact = json.loads(term)
    assert compact["ok"] is False
    assert any(c["name"] == "efa_devices" and "EFA" in c["message"] for c in compact["checks"])


def test_a_warning_fails_only_with_strict(tmp_path: Path) -> None:
    tcp = {"FI_PROVIDER": "tcp"}
    small = ("--size", "4Mi", "--iterations", "2", "--min-gbps", "0")  # this test is about the warning only
    rc, report, err, _ = preflight(tmp_path, "--backend", "UCX", *small, env=tcp)
    assert rc == 0, err
    assert by_name(report)["fabric_env"]["status"] == "warn"
    rc, report, err, term = preflight(tmp_path, "--backend", "UCX", *small, "--strict", env=tcp)
    assert rc == 1 and report["ok"] is False and "FAIL (fabric_env)" in err
    assert json.loads(term)["ok"] is False


def test_a_probe_past_its_deadline_is_a_failure_not_a_hang(tmp_path: Path) -> None:
    rc, report, _, term = preflight(tmp_path, "--backend", "UCX", "--timeout", "0.05")
    assert rc == 1
    checks = by_name(report)
    assert checks["nixl_backend"]["status"] == "fail" and checks["nixl_backend"]["value"].startswith("timed out")
    assert checks["loopback"]["status"] == "skip"
    assert json.loads(term)["ok"] is False

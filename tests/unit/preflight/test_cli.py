"""`duplex preflight` against fixture trees: what an EFA pod, a pod without EFA and a UCX pod get, on stderr, stdout,
--json and the termination log, and the exit codes. The NIXL checks are stood in for here (they need the real
package: tests/integration/test_preflight.py runs them)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import duplex_sidecars
from duplex.cli import SUBCOMMANDS
from duplex_sidecars.preflight import cli, memlock, nixl_checks
from duplex_sidecars.preflight.result import passed

from .trees import CAPS_DEFAULT, CAPS_WITH_IPC_LOCK, FI_INFO_EFA, FakeRoot

EFA_ENV = {"FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1", "LD_LIBRARY_PATH": "/opt/amazon/efa/lib"}


@pytest.fixture
def nixl_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    calls: list[tuple[Any, ...]] = []

    def fake_check(backend: str, size: int, iterations: int, min_gbps: float, timeout_s: float) -> list[Any]:
        calls.append((backend, size, iterations, min_gbps, timeout_s))
        return [
            passed(nixl_checks.BACKEND, f"{backend} instantiated (stand-in)"),
            passed(nixl_checks.LOOPBACK, "9.00 GB/s (stand-in)", gbps=9.0, verified=True),
        ]

    monkeypatch.setattr(nixl_checks, "check", fake_check)
    return calls


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No fabric variables, and a memlock limit like a container runtime's default (8 MiB), whatever this host's."""
    monkeypatch.setattr(memlock.resource, "getrlimit", lambda which: (8 << 20, 8 << 20))
    for name in ("FI_PROVIDER", "FI_EFA_USE_DEVICE_RDMA", "UCX_TLS", "LD_LIBRARY_PATH", "FI_PROVIDER_PATH"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")


def efa_pod(root: FakeRoot, devices: int = 16) -> None:
    root.uverbs(devices)
    root.fi_info(FI_INFO_EFA)
    root.pool(total=5128, free=5128)
    root.hugetlb_limit(str(5120 << 20))
    root.status(CAPS_WITH_IPC_LOCK)
    root.libfabric("/opt/amazon/efa/lib")


def preflight(root: FakeRoot, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any], str]:
    rc = cli.main(["--root", str(root.path), "--termination-log", "", *args])
    out, err = capsys.readouterr()
    return rc, json.loads(out), err


def test_the_subcommand_is_in_duplexs_table() -> None:
    assert SUBCOMMANDS["preflight"][0] == "duplex_sidecars.preflight.cli"


@pytest.mark.usefixtures("clean_env")
def test_a_provisioned_efa_pod_passes(
    fake_root: FakeRoot, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, nixl_calls: list
) -> None:
    efa_pod(fake_root)
    for k, v in EFA_ENV.items():
        monkeypatch.setenv(k, v)
    rc, doc, err = preflight(
        fake_root, capsys, "--backend", "LIBFABRIC", "--efa-devices", "16", "--hugepages", "5120Mi"
    )
    assert rc == 0, err
    assert [c["status"] for c in doc["checks"]] == ["pass"] * 7
    assert nixl_calls == [("LIBFABRIC", 64 << 20, 8, 1.0, 120.0)]
    assert (
        err.splitlines()[0]
        == f"duplex preflight: backend LIBFABRIC, 16 EFA devices, hugepages-2Mi 5120Mi; root {fake_root.path}"
    )
    assert "PASS  efa_devices    16 of 16" in err and err.splitlines()[-1].startswith("preflight PASS: 7 pass")


@pytest.mark.usefixtures("clean_env", "nixl_calls")
def test_a_pod_without_efa_fails_naming_efa(fake_root: FakeRoot, capsys: pytest.CaptureFixture[str]) -> None:
    fake_root.status(CAPS_DEFAULT)
    rc, doc, err = preflight(
        fake_root, capsys, "--backend", "LIBFABRIC", "--efa-devices", "16", "--hugepages", "5120Mi"
    )
    assert rc == 1 and doc["ok"] is False
    failed = {c["name"]: c["message"] for c in doc["checks"] if c["status"] == "fail"}
    assert set(failed) == {"efa_devices", "libfabric_efa", "hugepages", "memlock"}
    assert "EFA device plugin" in failed["efa_devices"] and "IPC_LOCK" in failed["memlock"]
    assert "FAIL  efa_devices    0 of 16" in err
    assert err.splitlines()[-1].startswith("preflight FAIL (efa_devices, libfabric_efa, hugepages, memlock)")


@pytest.mark.usefixtures("clean_env")
def test_ucx_skips_the_efa_checks_and_says_so(
    fake_root: FakeRoot, capsys: pytest.CaptureFixture[str], nixl_calls: list
) -> None:
    rc, doc, err = preflight(fake_root, capsys, "--backend", "ucx", "--min-gbps", "0.5", "--size", "4Mi")
    assert rc == 0
    statuses = {c["name"]: c["status"] for c in doc["checks"]}
    assert statuses == {"efa_devices": "skip", "libfabric_efa": "skip", "hugepages": "skip", "memlock": "skip",
                        "fabric_env": "pass", "nixl_backend": "pass", "loopback": "pass"}  # fmt: skip
    assert "EFA is not required with the UCX backend" in err
    assert nixl_calls == [("UCX", 4 << 20, 8, 0.5, 120.0)]


@pytest.mark.usefixtures("clean_env", "nixl_calls")
def test_ucx_with_efa_devices_requested_checks_them(fake_root: FakeRoot, capsys: pytest.CaptureFixture[str]) -> None:
    rc, doc, _ = preflight(fake_root, capsys, "--backend", "UCX", "--efa-devices", "4")
    statuses = {c["name"]: c["status"] for c in doc["checks"]}
    assert rc == 1 and statuses["efa_devices"] == "fail" and statuses["memlock"] == "fail"
    assert statuses["libfabric_efa"] == "skip"  # UCX does not use libfabric, EFA or not


@pytest.mark.usefixtures("clean_env", "nixl_calls")
def test_warnings_fail_only_with_strict(
    fake_root: FakeRoot, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FI_PROVIDER", "tcp")
    rc, doc, _ = preflight(fake_root, capsys, "--backend", "UCX")
    assert rc == 0 and doc["counts"]["warn"] == 1
    rc, doc, err = preflight(fake_root, capsys, "--backend", "UCX", "--strict")
    assert rc == 1 and doc["ok"] is False and doc["strict"] is True and "FAIL (fabric_env)" in err


@pytest.mark.usefixtures("clean_env", "nixl_calls")
def test_json_and_termination_log_files(
    fake_root: FakeRoot, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report, term = tmp_path / "report.json", tmp_path / "termination-log"
    rc = cli.main(["--root", str(fake_root.path), "--backend", "LIBFABRIC", "--json", str(report),
                   "--termination-log", str(term)])  # fmt: skip
    assert rc == 1 and capsys.readouterr().out == ""
    full, compact = json.loads(report.read_text()), json.loads(term.read_text())
    assert compact["version"] == full["version"] == 1 and compact["ok"] is full["ok"] is False
    assert [c["name"] for c in compact["checks"]] == [c["name"] for c in full["checks"]]
    assert all("data" not in c for c in compact["checks"]) and len(term.read_bytes()) < 4096


def test_termination_log_defaults_to_the_kubelets_file_only_when_it_exists(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kubelet_file = tmp_path / "termination-log"
    monkeypatch.setattr(cli, "KUBERNETES_TERMINATION_LOG", str(kubelet_file))
    assert cli.termination_log_path(None) is None  # outside a pod nothing is created
    kubelet_file.write_text("")
    assert cli.termination_log_path(None) == str(kubelet_file)
    assert cli.termination_log_path("") is None and cli.termination_log_path("/x") == "/x"


def test_bad_arguments_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--backend", "TCP"], ["--hugepages", "lots"]):
        with pytest.raises(SystemExit) as e:
            cli.main(argv)
        assert e.value.code == 2
    assert "not a byte quantity" in capsys.readouterr().err


def test_the_package_needs_only_the_standard_library(tmp_path: Path) -> None:
    """It must run from the engine image, which has Python and NIXL but not duplex's dependencies: import it from a
    Python without site-packages (-S) and with nothing but the package's parent on the path."""
    sidecars = Path(duplex_sidecars.__file__).resolve().parents[1]
    code = "import duplex_sidecars.preflight.cli, duplex_sidecars.preflight.nixl_probe; print('ok')"
    proc = subprocess.run(
        [sys.executable, "-S", "-c", code],
        env={"PYTHONPATH": str(sidecars)},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.stdout.strip() == "ok", proc.stderr

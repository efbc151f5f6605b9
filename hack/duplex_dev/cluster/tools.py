"""Where the control plane's binaries are: an explicit dir, $DUPLEX_BIN, or whatever hack/build-tools.sh builds or
finds in its version-keyed cache. hack/build-tools.sh is the single source of truth for versions and the cache path."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from duplex_dev.cluster.node import NodeBinaries

BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl", "kwok")
STAGES_FILE = "kwok-stages.yaml"

REPO_ROOT = Path(__file__).resolve().parents[3]
BUILD_SCRIPT = REPO_ROOT / "hack" / "build-tools.sh"
FAKE_NODES = REPO_ROOT / "tests" / "fixtures" / "fake-nodes.yaml"


class ToolsMissing(RuntimeError):
    """The binaries are not there (and were not, or could not be, built)."""


def missing_in(bin_dir: Path) -> list[str]:
    names = [b for b in BINARIES if not os.access(bin_dir / b, os.X_OK)]
    if not (bin_dir / STAGES_FILE).is_file():
        names.append(STAGES_FILE)
    return names


def _check(bin_dir: Path) -> Path:
    missing = missing_in(bin_dir)
    if missing:
        raise ToolsMissing(f"{bin_dir} lacks {', '.join(missing)}")
    return bin_dir


def default_bin_dir() -> Path:
    """The cache dir hack/build-tools.sh uses for the pinned versions (asks the script; builds nothing)."""
    if not BUILD_SCRIPT.is_file():
        raise ToolsMissing(f"{BUILD_SCRIPT} not found: set DUPLEX_BIN or pass --bin-dir")
    out = subprocess.run(["bash", str(BUILD_SCRIPT), "--print-dir"], capture_output=True, text=True, check=False)
    if out.returncode != 0 or not out.stdout.strip():
        raise ToolsMissing(f"{BUILD_SCRIPT} --print-dir failed: {out.stderr.strip()}")
    return Path(out.stdout.strip().splitlines()[-1])


def _print(flag: str) -> list[str]:
    out = subprocess.run(["bash", str(BUILD_SCRIPT), flag], capture_output=True, text=True, check=False)
    if out.returncode != 0 or not out.stdout.strip():
        raise ToolsMissing(f"{BUILD_SCRIPT} {flag} failed: {out.stderr.strip()}")
    return out.stdout.strip().splitlines()


def node_binaries(bin_dir: Path) -> NodeBinaries:
    """The real node's binaries: the kubelet and kube-proxy beside the control plane's, containerd and CoreDNS in
    version-keyed dirs of their own (hack/build-tools.sh --print-node)."""
    containerd_dir, _, coredns = _print("--print-node")
    binaries = NodeBinaries(bin_dir / "kubelet", bin_dir / "kube-proxy", Path(containerd_dir), Path(coredns))
    missing = binaries.missing()
    if missing:
        raise ToolsMissing(f"the real node needs {', '.join(missing)}: run hack/setup.sh (or bash hack/build-tools.sh)")
    return binaries


def pause_archive() -> Path:
    """The node's pod sandbox image (hack/pause), as an archive containerd imports."""
    _, archive, _ = _print("--print-node")
    if not Path(archive).is_file():
        raise ToolsMissing(f"{archive} is missing: run hack/setup.sh (or bash hack/build-tools.sh)")
    return Path(archive)


def locate(bin_dir: str | Path | None = None) -> Path:
    """The bin dir to use without building anything: explicit, $DUPLEX_BIN, or build-tools.sh's cache dir."""
    if bin_dir:
        return _check(Path(bin_dir).expanduser())
    if os.environ.get("DUPLEX_BIN"):
        return _check(Path(os.environ["DUPLEX_BIN"]).expanduser())
    return _check(default_bin_dir())


def build_or_reuse(bin_dir: str | Path | None = None) -> Path:
    """Run hack/build-tools.sh (cheap when everything is cached), its progress going to stderr; return the bin dir."""
    target = Path(bin_dir).expanduser() if bin_dir else None
    if target is None and os.environ.get("DUPLEX_BIN"):
        target = Path(os.environ["DUPLEX_BIN"]).expanduser()
    if target is not None and not missing_in(target):
        return target
    if not BUILD_SCRIPT.is_file():
        raise ToolsMissing(f"{BUILD_SCRIPT} not found and no complete --bin-dir/DUPLEX_BIN given")
    env = {"DUPLEX_TOOLS": "run", **os.environ}  # the cluster's binaries, not the chart's checkers
    if target is not None:
        env["DUPLEX_BIN"] = str(target)
    try:
        sys.stderr.flush()
        progress = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # a captured stream (pytest): let the child inherit fd 2
        progress = None
    out = subprocess.run(
        ["bash", str(BUILD_SCRIPT)], stdout=subprocess.PIPE, stderr=progress, text=True, env=env, check=False
    )
    if out.returncode != 0:
        raise ToolsMissing(f"hack/build-tools.sh failed with exit code {out.returncode}")
    return _check(Path(out.stdout.strip().splitlines()[-1]))

"""The real node's cgroup, one subtree in every cgroup v1 hierarchy of the machine (these machines run cgroups v1 in
hybrid mode; the kubelet uses the cgroupfs driver). The node's daemons start inside it, so the shims and containers
they start are inside it too: stopping the node is killing what the subtree holds and removing it."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

MOUNT = Path("/sys/fs/cgroup")
# The pids hierarchy sees every process; it is where membership is read.
PIDS = MOUNT / "pids"


def hierarchies() -> list[Path]:
    """The v1 hierarchies (cpu, memory, pids, the named systemd one, ...), not the cgroup2 mount beside them."""
    out = []
    for entry in sorted(MOUNT.iterdir()):
        if entry.name == "unified" or not (entry / "cgroup.procs").exists():
            continue
        out.append(entry)
    return out


def create(root: str, child: str = "") -> None:
    """`root` (and `root/child`) in every hierarchy. A new cpuset cgroup starts with no CPUs or memory nodes in v1:
    copy its parent's."""
    for hierarchy in hierarchies():
        parent = hierarchy
        for part in [p for p in f"{root}/{child}".split("/") if p]:
            path = parent / part
            path.mkdir(exist_ok=True)
            if hierarchy.name == "cpuset":
                for knob in ("cpuset.cpus", "cpuset.mems"):
                    if not (path / knob).read_text().strip():
                        (path / knob).write_text((parent / knob).read_text())
            parent = path


def join_command(root: str, child: str) -> str:
    """A shell snippet that moves the shell into `root/child` in every hierarchy (then `exec` the daemon)."""
    paths = " ".join(str(h / root.strip("/") / child / "cgroup.procs") for h in hierarchies())
    return f"for f in {paths}; do echo $$ > $f; done"


def _subtree(hierarchy: Path, root: str) -> list[Path]:
    top = hierarchy / root.strip("/")
    if not top.is_dir():
        return []
    dirs = [Path(d) for d, _, _ in os.walk(top)]
    return sorted(dirs, key=lambda p: len(p.parts), reverse=True)  # deepest first


def pids(root: str) -> set[int]:
    found: set[int] = set()
    for hierarchy in hierarchies():
        for path in _subtree(hierarchy, root):
            try:
                found.update(int(p) for p in (path / "cgroup.procs").read_text().split())
            except OSError:
                continue
    return found


def kill_all(root: str, timeout: float = 20.0) -> set[int]:
    """SIGKILL everything in the subtree until it is empty; returns the pids that would not die."""
    deadline = time.monotonic() + timeout
    left = pids(root)
    while left and time.monotonic() < deadline:
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.1)
        left = pids(root)
    return left


def remove(root: str) -> list[Path]:
    """rmdir the subtree in every hierarchy, deepest first; returns what is left (a cgroup still holding a task)."""
    left = []
    for hierarchy in hierarchies():
        for path in _subtree(hierarchy, root):
            try:
                path.rmdir()
            except OSError:
                left.append(path)
    return left


def leftovers(root: str) -> list[str]:
    return [str(p) for h in hierarchies() for p in _subtree(h, root)]

"""May the engine pin the memory NIXL registers with the NIC? Either CAP_IPC_LOCK is effective (the kernel then
ignores RLIMIT_MEMLOCK) or the limit is high enough. Kubernetes has no ulimit field, hence IPC_LOCK on EFA pods."""

from __future__ import annotations

import resource
from collections.abc import Callable
from pathlib import Path

from duplex_sidecars.preflight.quantity import format_bytes
from duplex_sidecars.preflight.result import CheckResult, failed, passed, skipped, warned

NAME = "memlock"
CAP_IPC_LOCK = 14  # linux/capability.h

GetRlimit = Callable[[int], tuple[int, int]]


def proc_status(root: Path) -> dict[str, str]:
    try:
        text = (root / "proc" / "self" / "status").read_text()
    except OSError:
        return {}
    return {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in text.splitlines())}


def has_cap(mask_hex: str, cap: int) -> bool:
    try:
        return bool(int(mask_hex, 16) >> cap & 1)
    except ValueError:
        return False


def _limit(n: int) -> str:
    return "unlimited" if n == resource.RLIM_INFINITY else format_bytes(n)


def check(root: Path, required: bool, needed_bytes: int, getrlimit: GetRlimit | None = None) -> CheckResult:
    """`needed_bytes`: what this preflight registers itself; the engine registers far more."""
    status = proc_status(root)
    soft, hard = (getrlimit or resource.getrlimit)(resource.RLIMIT_MEMLOCK)
    eff = has_cap(status.get("CapEff", ""), CAP_IPC_LOCK)
    bnd = has_cap(status.get("CapBnd", ""), CAP_IPC_LOCK)
    uid = status.get("Uid", "").split()[1:2]  # real, effective, saved, fs: the effective one decides
    euid = int(uid[0]) if uid and uid[0].isdigit() else None
    value = f"CAP_IPC_LOCK {'effective' if eff else 'not effective'}, RLIMIT_MEMLOCK {_limit(soft)}"
    data = {
        "ipc_lock_effective": eff,
        "ipc_lock_bounding": bnd,
        "euid": euid,
        "rlimit_soft": None if soft == resource.RLIM_INFINITY else soft,
        "rlimit_hard": None if hard == resource.RLIM_INFINITY else hard,
    }
    if eff or soft == resource.RLIM_INFINITY:
        return passed(NAME, value, **data)
    if not required:
        return skipped(NAME, value, "pinned memory is not required with the UCX backend", **data)
    if bnd and euid not in (0, None):
        fix = (
            f"IPC_LOCK was added but the container runs as uid {euid}, and a non-root process does not get added "
            "capabilities as effective: run the engine as root, or raise the node's containerd LimitMEMLOCK to "
            "infinity"
        )
    else:
        fix = (
            "add securityContext.capabilities.add: [IPC_LOCK] to the container (the operator renders it with "
            "network.efa.enabled), or raise the node's containerd LimitMEMLOCK to infinity"
        )
    if soft < needed_bytes:
        return failed(
            NAME,
            value,
            f"RLIMIT_MEMLOCK is {_limit(soft)} and CAP_IPC_LOCK is not effective, so NIXL cannot pin even this "
            f"check's {format_bytes(needed_bytes)} for EFA: {fix}",
            **data,
        )
    return warned(
        NAME,
        value,
        f"RLIMIT_MEMLOCK is {_limit(soft)} without CAP_IPC_LOCK: enough for this check, but the engine pins far "
        f"more for EFA; {fix}",
        **data,
    )

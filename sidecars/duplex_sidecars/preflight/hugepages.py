"""Has the container the 2 MiB hugepages it requested? Three places must agree: the node's pool (sysfs, or
/proc/meminfo when 2 MiB is the default size), the free pages in it, and the container's hugetlb cgroup limit, which
is what the kubelet sets from `hugepages-2Mi` and what the engine actually runs into."""

from __future__ import annotations

from pathlib import Path

from duplex_sidecars.preflight.quantity import format_bytes, to_quantity
from duplex_sidecars.preflight.result import CheckResult, failed, passed, skipped, warned

NAME = "hugepages"
PAGE = 2 << 20
POOL_DIR = "sys/kernel/mm/hugepages/hugepages-2048kB"
CGROUP_LIMITS = ("sys/fs/cgroup/hugetlb.2MB.max", "sys/fs/cgroup/hugetlb/hugetlb.2MB.limit_in_bytes")  # v2, v1
# The EFA driver pre-allocates 5128 pages; the EKS guide's canonical request is 5120Mi.
EFA_DEFAULT = "5120Mi"


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def meminfo(root: Path) -> dict[str, int]:
    """/proc/meminfo's numbers, in the unit the file uses (kB for sizes, pages for HugePages_*)."""
    out: dict[str, int] = {}
    try:
        text = (root / "proc" / "meminfo").read_text()
    except OSError:
        return out
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            out[key.strip()] = int(parts[0])
    return out


def pool(root: Path) -> tuple[int, int, str] | None:
    """(total, free) 2 MiB pages on the node and where that was read, or None if neither source knows."""
    total = _read_int(root / POOL_DIR / "nr_hugepages")
    free = _read_int(root / POOL_DIR / "free_hugepages")
    if total is not None and free is not None:
        return total, free, "/" + POOL_DIR
    info = meminfo(root)
    if info.get("Hugepagesize") == 2048 and "HugePages_Total" in info and "HugePages_Free" in info:
        return info["HugePages_Total"], info["HugePages_Free"], "/proc/meminfo"
    return None


def cgroup_limit(root: Path) -> tuple[int | None, str] | None:
    """The container's hugetlb limit for 2 MiB pages in bytes (None: unlimited), or None without a hugetlb cgroup."""
    for rel in CGROUP_LIMITS:
        path = root / rel
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text == "max":
            return None, "/" + rel
        try:
            limit = int(text)
        except ValueError:
            continue
        # cgroup v1 writes "no limit" as the largest page-aligned signed 64-bit value.
        return (None if limit >= 2**62 else limit), "/" + rel
    return None


def check(root: Path, requested_bytes: int) -> CheckResult:
    if requested_bytes <= 0:
        return skipped(NAME, "not requested", f"no --hugepages given (EFA pods request hugepages-2Mi: {EFA_DEFAULT})")
    want_pages = -(-requested_bytes // PAGE)
    want = to_quantity(want_pages * PAGE)
    found = pool(root)
    if found is None:
        return failed(
            NAME,
            "no 2 MiB hugepage pool",
            f"neither /{POOL_DIR} nor /proc/meminfo (with Hugepagesize 2048 kB) shows a 2 MiB hugepage pool, "
            f"but {want} were requested: is /proc or /sys hidden from the container?",
            requested_pages=want_pages,
        )
    total, free, source = found
    data = {"requested_pages": want_pages, "total_pages": total, "free_pages": free, "source": source}
    value = f"{want} requested ({want_pages} pages); node pool {total} pages, {free} free ({source})"
    limit = cgroup_limit(root)
    if limit is not None:
        limit_bytes, limit_source = limit
        data |= {"cgroup_limit_bytes": limit_bytes, "cgroup_source": limit_source}
        value += f", container limit {'unlimited' if limit_bytes is None else format_bytes(limit_bytes)}"
        if limit_bytes is not None and limit_bytes < want_pages * PAGE:
            return failed(
                NAME,
                value,
                f"the container may use {format_bytes(limit_bytes)} of 2 MiB hugepages ({limit_source}) but the spec "
                f"promises {want}: request hugepages-2Mi: {want} in "
                "this container's requests and limits (the init container needs the same resources as the engine)",
                **data,
            )
    if total < want_pages:
        return failed(
            NAME,
            value,
            f"the node has {total} hugepages of 2 MiB, {want_pages} are requested: EFA nodes pre-allocate 5128 "
            '(EFA driver); on Bottlerocket set settings.kernel.sysctl."vm.nr_hugepages", elsewhere vm.nr_hugepages',
            **data,
        )
    if free < want_pages:
        return warned(
            NAME,
            value,
            f"only {free} of the node's {total} hugepages of 2 MiB are free, {want_pages} are requested: another "
            "process on the node holds them, so the engine's allocations may fail",
            **data,
        )
    return passed(NAME, value, **data)

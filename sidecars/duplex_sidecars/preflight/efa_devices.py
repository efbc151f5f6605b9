"""Are the EFA devices the pod requested there? The EFA device plugin injects one /dev/infiniband/uverbsN per device.

Counting /dev/infiniband and not /sys/class/net is deliberate: EFA interfaces are not netdevs in the pod's network
namespace, so /sys/class/net is empty inside pods even on EFA nodes (Ray hit this, ray-project/ray#62339).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from duplex_sidecars.preflight.result import CheckResult, failed, passed, skipped, warned

NAME = "efa_devices"
EFA_RESOURCE = "vpc.amazonaws.com/efa"


def uverbs_devices(root: Path) -> list[Path]:
    base = root / "dev" / "infiniband"
    try:
        return sorted((p for p in base.iterdir() if p.name.startswith("uverbs")), key=lambda p: p.name)
    except OSError:
        return []


def efa_device_names(root: Path) -> list[str]:
    """RDMA devices under /sys/class/infiniband whose driver is efa (EFA names them rdmapXsY; mlx5_N is Mellanox)."""
    base = root / "sys" / "class" / "infiniband"
    try:
        entries = sorted(base.iterdir(), key=lambda p: p.name)
    except OSError:
        return []
    names = []
    for dev in entries:
        driver = dev / "device" / "driver"
        try:
            driver_name = Path(os.readlink(driver)).name
        except OSError:
            driver_name = ""
        if driver_name == "efa" or (not driver_name and dev.name.startswith("rdmap")):
            names.append(dev.name)
    return names


def can_open(path: Path) -> bool:
    return os.access(path, os.R_OK | os.W_OK)


def check(root: Path, requested: int, required: bool, openable: Callable[[Path], bool] = can_open) -> CheckResult:
    """`requested` is the spec's devices per pod (0: not given); `required` is whether the backend needs EFA at all."""
    found = uverbs_devices(root)
    base = "/dev/infiniband"
    value = f"{len(found)} of {requested}" if requested else f"{len(found)} found"
    data = {"found": len(found), "requested": requested, "devices": [p.name for p in found]}
    if not required:
        return skipped(NAME, value, "EFA is not required with the UCX backend (no --efa-devices given)", **data)
    want = max(requested, 1)
    if len(found) < want:
        of = f"{len(found)} of {requested}" if requested else f"{len(found)} (LIBFABRIC needs at least 1)"
        return failed(
            NAME,
            value,
            f"found {of} EFA devices under {base} (uverbs*): is the EFA device plugin (aws-efa-k8s-device-plugin) "
            f"running on this node, and does the container request {EFA_RESOURCE}: {want} in requests and limits?",
            **data,
        )
    unusable = [p.name for p in found if not openable(p)]
    if unusable:
        return failed(
            NAME,
            value,
            f"{', '.join(unusable)} under {base} cannot be opened read-write by uid {os.getuid()}: the device plugin "
            "passes the devices in, so this is the container's securityContext or an LSM policy denying them",
            **data,
        )
    if requested and len(found) > requested:
        return warned(
            NAME,
            value,
            f"found {len(found)} EFA devices under {base} but {requested} were requested: a hostPath mount of "
            f"{base} or the NVIDIA device plugin's MOFED mode (default from v0.19.0) hands out devices "
            "the EFA device plugin did not allocate to this pod",
            **data,
        )
    return passed(NAME, value, **data)

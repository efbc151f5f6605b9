"""Does the environment let the backend use the fabric? The usual silent TCP fallback is one of configuration:
FI_PROVIDER naming tcp or sockets, UCX on EFA hardware, or a libfabric other than the EFA installer's first on
LD_LIBRARY_PATH (NIXL's plugin then runs against a libfabric it was not built for)."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from duplex_sidecars.preflight import libfabric
from duplex_sidecars.preflight.result import CheckResult, failed, passed, warned

NAME = "fabric_env"
TCP_PROVIDERS = frozenset({"tcp", "sockets", "udp", "net"})
# UCX transports that use RDMA hardware; without one of them pod-to-pod traffic goes over tcp.
UCX_RDMA_TLS = frozenset(
    {"all", "ib", "rc", "rc_v", "rc_x", "rc_mlx5", "ud", "ud_v", "ud_x", "ud_mlx5", "dc", "dc_x", "dc_mlx5"}
)
SHOWN = ("FI_PROVIDER", "FI_EFA_USE_DEVICE_RDMA", "UCX_TLS", "LD_LIBRARY_PATH")


def _names(value: str) -> tuple[bool, list[str]]:
    """FI_PROVIDER / UCX_TLS lists: (is an exclusion list '^a,b', the names). A layered libfabric provider
    ('tcp;ofi_rxm') counts as its parts."""
    excluded = value.startswith("^")
    return excluded, [n.strip() for n in re.split(r"[,;]", value.lstrip("^")) if n.strip()]


def _fi_provider_issue(value: str | None, backend: str) -> tuple[str, str] | None:
    """(status, message) for FI_PROVIDER, or None when it is fine."""
    if value is None:
        return None
    excluded, names = _names(value)
    tcp = sorted(TCP_PROVIDERS.intersection(names))
    if backend != "LIBFABRIC":
        if tcp and not excluded:
            return "warn", (
                f"FI_PROVIDER={value} is set: UCX ignores it, but any libfabric user in this pod (and this pod under "
                "the LIBFABRIC backend) runs over TCP"
            )
        return None
    if excluded:
        if "efa" in names:
            return "fail", f"FI_PROVIDER={value} excludes efa: libfabric cannot use EFA; set FI_PROVIDER=efa"
        return "warn", (
            f"FI_PROVIDER={value} allows every other provider, tcp and sockets included, so a missing efa falls "
            "back to TCP silently; set FI_PROVIDER=efa"
        )
    if "efa" not in names:
        return "fail", (
            f"FI_PROVIDER={value} keeps libfabric off EFA"
            + (" and on TCP: a silent TCP fallback by configuration" if tcp else "")
            + "; set FI_PROVIDER=efa"
        )
    if tcp:
        return "warn", (
            f"FI_PROVIDER={value} lets libfabric fall back to {', '.join(tcp)} when efa fails, silently; "
            "set FI_PROVIDER=efa"
        )
    return None


def _library_path_issue(root: Path, library_path: str) -> str | None:
    """With the EFA installer in the image, its libfabric must be the one the loader finds first."""
    installer_dirs = (f"{libfabric.EFA_INSTALLER}/lib", f"{libfabric.EFA_INSTALLER}/lib64")
    present = [d for d in installer_dirs if (root / d.lstrip("/") / "libfabric.so.1").is_file()]
    if not present:
        return None
    dirs = [d for d in library_path.split(os.pathsep) if d]
    first = libfabric.find_libfabric(root, dirs)
    if first is not None and first[0].rstrip("/") in installer_dirs:
        return None
    where = f"{first[0]} comes first on LD_LIBRARY_PATH" if first else "LD_LIBRARY_PATH does not name it"
    return (
        f"the EFA installer's libfabric is in {present[0]} but {where}: NIXL's LIBFABRIC plugin then loads "
        f"another libfabric, and version skew loses RDMA silently; put {present[0]} first "
        "(spec.network.efa.libraryPath)"
    )


def check(env: Mapping[str, str], backend: str, root: Path, efa_names: Sequence[str], rdma_devices: int) -> CheckResult:
    """`efa_names`: RDMA devices identified as EFA (sysfs); `rdma_devices`: /dev/infiniband/uverbs* present."""
    issues: list[tuple[str, str]] = []
    fi = _fi_provider_issue(env.get("FI_PROVIDER"), backend)
    if fi:
        issues.append(fi)
    if backend == "LIBFABRIC":
        if env.get("FI_EFA_USE_DEVICE_RDMA") == "0":
            issues.append(
                ("warn", "FI_EFA_USE_DEVICE_RDMA=0 turns off EFA's RDMA reads: transfers bounce through host copies")
            )
        lp = _library_path_issue(root, env.get("LD_LIBRARY_PATH", ""))
        if lp:
            issues.append(("warn", lp))
    else:
        if efa_names:
            issues.append(
                (
                    "warn",
                    f"the pod has EFA devices ({', '.join(efa_names[:4])}) but the backend is UCX, which on EFA "
                    "silently lands on TCP (about 0.3-3 GB/s): use the LIBFABRIC backend (kvTransfer.backend)",
                )
            )
        tls = env.get("UCX_TLS")
        if tls is not None and rdma_devices:
            excluded, names = _names(tls)
            rdma = UCX_RDMA_TLS.intersection(names)
            if (excluded and rdma) or (not excluded and not rdma):
                issues.append(("warn", f"UCX_TLS={tls} leaves UCX no RDMA transport, though the pod has RDMA devices"))
    shown = [f"{k}={env[k]}" for k in SHOWN if k in env and (k != "UCX_TLS" or backend == "UCX")]
    value = ", ".join(shown) if shown else "no fabric variables set"
    data = {k: env[k] for k in SHOWN if k in env}
    if not issues:
        return passed(NAME, value, **data)
    message = "; ".join(m for _, m in issues)
    if any(s == "fail" for s, _ in issues):
        return failed(NAME, value, message, **data)
    return warned(NAME, value, message, **data)

"""Byte amounts as Kubernetes writes them (`5120Mi`, `2Gi`, `64M`, `1048576`) and as people read them."""

from __future__ import annotations

import re

_SUFFIX = {
    "": 1,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
}
_QUANTITY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(Ki|Mi|Gi|Ti|k|M|G|T)?\s*$")


def parse_bytes(text: str) -> int:
    """`5120Mi` -> 5368709120. Raises ValueError on anything Kubernetes would not read as a byte quantity."""
    m = _QUANTITY.match(text)
    if not m:
        raise ValueError(f"{text!r} is not a byte quantity (e.g. 5120Mi, 2Gi, 64M or a plain number of bytes)")
    return int(float(m.group(1)) * _SUFFIX[m.group(2) or ""])


def format_bytes(n: int | float) -> str:
    """Binary units, as Kubernetes resources are written: 5368709120 -> '5120 MiB', 8388608 -> '8 MiB'."""
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            scaled = n / size
            # Whole MiB read better than fractional GiB: hugepages are requested as 5120Mi, not 5Gi.
            if scaled != int(scaled) and unit in ("TiB", "GiB"):
                continue
            return f"{scaled:.0f} {unit}" if scaled == int(scaled) else f"{scaled:.1f} {unit}"
    return f"{int(n)} B"


def to_quantity(n: int) -> str:
    """Bytes as a Kubernetes resource amount, in Mi when whole (hugepages are written 5120Mi): 5368709120 -> 5120Mi."""
    for unit in ("Mi", "Ki"):
        if n % _SUFFIX[unit] == 0:
            return f"{n // _SUFFIX[unit]}{unit}"
    return str(n)

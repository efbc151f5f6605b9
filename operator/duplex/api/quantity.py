"""Kubernetes resource quantities ("500m", "1Gi") as exact numbers, read by the kubernetes client's own parser."""

from __future__ import annotations

from decimal import Decimal


def quantity(value: str) -> Decimal:
    from kubernetes.utils import (
        parse_quantity,  # on first use: the client is slow to import and the API needs it rarely
    )

    parsed: Decimal = parse_quantity(value)  # the client has no annotations: say what it returns
    return parsed

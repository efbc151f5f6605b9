"""The operator harness of the integration tests: duplex_dev.launch.operator (shared with bench/operator_bench.py),
plus the observation window the tests wait out."""

from __future__ import annotations

import time

from duplex_dev.launch.operator import (
    CLUSTER_ROLE,
    CRD,
    OPERATOR_USER,
    ROOT,
    WRITE_VERBS,
    OperatorProcess,
    free_port,
    install_crd_and_rbac,
    operator_requests,
    operator_writes,
    query,
    resource,
)

__all__ = [
    "CLUSTER_ROLE",
    "CRD",
    "OPERATOR_USER",
    "ROOT",
    "WRITE_VERBS",
    "OperatorProcess",
    "free_port",
    "install_crd_and_rbac",
    "operator_requests",
    "operator_writes",
    "query",
    "resource",
    "wait_seconds",
]


def wait_seconds(seconds: float) -> None:
    """An observation window (the assertion is about what happens during it), not a synchronisation sleep."""
    time.sleep(seconds)

"""Names and labels shared by every child object."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from duplex import __version__

MANAGED_BY = "duplex"
SERVING_LABEL = "duplex.dev/serving"
ROLE_LABEL = "duplex.dev/role"
ENGINE_HASH_ANNOTATION = "duplex.dev/engine-config-hash"
# The KV revision of an engine pod (duplex/revision.py): on its labels, in its environment (the engine advertises it
# to the router as a response header), on the role Services (the revision new turns go to).
KV_REVISION_LABEL = "duplex.dev/kv-revision"
HTTP_PORT = 8000
ADMIN_PORT = 9090  # the router's /metrics and /ready detail: not in its Service, fenced to metrics namespaces


def config_hash(pod_spec: dict[str, Any]) -> str:
    """The ENGINE_HASH_ANNOTATION of a pod spec."""
    return hashlib.sha256(json.dumps(pod_spec, sort_keys=True).encode()).hexdigest()[:16]


def child_name(serving: str, suffix: str) -> str:
    return f"{serving}-{suffix}"


def selector(serving: str, role: str) -> dict[str, str]:
    """Labels that select one role's pods; immutable once a Deployment exists."""
    return {SERVING_LABEL: serving, ROLE_LABEL: role}


def labels(serving: str, role: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "vllm" if role in ("prefill", "decode") else "duplex-router",
        "app.kubernetes.io/instance": serving,
        "app.kubernetes.io/component": role,
        "app.kubernetes.io/part-of": "duplex",
        "app.kubernetes.io/managed-by": MANAGED_BY,
        "app.kubernetes.io/version": __version__,
        **selector(serving, role),
    }

"""The engine API key: a Secret per serving that the engines require on /v1 (vLLM's VLLM_API_KEY) and only the
router holds, so that no other pod can send prefill `kv_transfer_params` naming another tenant's blocks.

The key is random and drawn once, by the shell (reconcile.py) when the Secret does not exist: the pure core has no
randomness, and a key derived from the spec would be readable by anyone who can read the spec. The Secret is never
patched, so a pass never rotates it. vLLM guards only /v1/*: /health and /metrics stay open to probes and scrapers.
"""

from __future__ import annotations

import secrets
from typing import Any

from duplex.children.kinds import SECRET
from duplex.children.labels import MANAGED_BY, SERVING_LABEL, child_name

SECRET_KEY = "api-key"
# On the pod templates of engines and router: the uid of the Secret whose key the pods read at start. A Secret deleted
# and made again holds a new key; the new uid rolls all three Deployments, so old and new keys never meet.
KEY_ANNOTATION = "duplex.dev/engine-key-uid"
ENGINE_ENV = "VLLM_API_KEY"  # vLLM's equivalent of --api-key
ROUTER_ENV = "DUPLEX_ENGINE_API_KEY"  # the router's engine_api_key_env


def secret_name(serving: str) -> str:
    return child_name(serving, "engine-key")


def env(serving: str, name: str) -> dict[str, Any]:
    """An env entry reading the key from the Secret (engines: VLLM_API_KEY, router: DUPLEX_ENGINE_API_KEY)."""
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": secret_name(serving), "key": SECRET_KEY}}}


def engine_key_secret(serving: str, namespace: str) -> dict[str, Any]:
    """The Secret without its key: what the core decides; the shell adds the key when it creates it."""
    labels = {
        "app.kubernetes.io/instance": serving,
        "app.kubernetes.io/component": "engine-key",
        "app.kubernetes.io/part-of": "duplex",
        "app.kubernetes.io/managed-by": MANAGED_BY,
        SERVING_LABEL: serving,
    }
    return SECRET.manifest({"name": secret_name(serving), "namespace": namespace, "labels": labels}, type="Opaque")


def with_fresh_key(secret: dict[str, Any]) -> dict[str, Any]:
    """The Secret as the shell creates it: 256 random bits. Never logged, never in status or Events."""
    return {**secret, "stringData": {SECRET_KEY: secrets.token_urlsafe(32)}}


def template_annotations(key_uid: str | None) -> dict[str, str]:
    return {KEY_ANNOTATION: key_uid} if key_uid else {}

"""The engine guard: the engine key required on every path of an engine but /health and /metrics.

A ConfigMap per serving holds duplex_engine_guard.py (stdlib only, next to this file); the engine pods mount it,
put it on PYTHONPATH and start vLLM with `--middleware duplex_engine_guard.EngineKeyGuard`. It also holds
duplex_drain.py, the decode pods' preStop hook (lifecycle.py). The engine image needs nothing of duplex. Its content
changes only with the operator, which never rolls engines by itself: a new guard applies as pods restart.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from duplex.children import duplex_drain, duplex_engine_guard
from duplex.children.kinds import CONFIG_MAP
from duplex.children.labels import child_name, labels

MODULE = duplex_engine_guard.__name__.rsplit(".", 1)[-1]
MIDDLEWARE = f"{MODULE}.{duplex_engine_guard.EngineKeyGuard.__name__}"
MOUNT_PATH = "/opt/duplex/engine-guard"
VOLUME = "engine-guard"
SOURCES = {Path(str(m.__file__)).name: Path(str(m.__file__)).read_text() for m in (duplex_engine_guard, duplex_drain)}


def configmap_name(serving: str) -> str:
    return child_name(serving, "guard")  # within the 8 characters a suffix may take (api/naming.py)


def engine_guard_configmap(serving: str, namespace: str) -> dict[str, Any]:
    meta_labels = {**labels(serving, "engine-guard"), "app.kubernetes.io/name": "duplex-engine-guard"}
    meta = {"name": configmap_name(serving), "namespace": namespace, "labels": meta_labels}
    return CONFIG_MAP.manifest(meta, data=dict(SOURCES))


def args() -> list[str]:
    return ["--middleware", MIDDLEWARE]


def env() -> list[dict[str, Any]]:
    return [{"name": "PYTHONPATH", "value": MOUNT_PATH}]


def volume(serving: str) -> dict[str, Any]:
    return {"name": VOLUME, "configMap": {"name": configmap_name(serving)}}


def mount() -> dict[str, Any]:
    return {"name": VOLUME, "mountPath": MOUNT_PATH, "readOnly": True}

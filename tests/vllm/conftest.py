"""Fixtures for the vLLM tier: the cached vLLM virtualenv (hack/setup-vllm.sh) and a runner for hack/vllm_check.py.

A missing virtualenv is a failure, never a skip: in CI because .ci/run must have built it, locally because the fix is
one command (bash hack/setup-vllm.sh, about 3 minutes and 9 GB once)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from duplex_dev.versions import version

ROOT = Path(__file__).resolve().parents[2]
CHECKER = ROOT / "hack" / "vllm_check.py"
VLLM_VERSION = version("VLLM_VERSION")
CACHE = Path(os.environ.get("DUPLEX_CACHE") or Path.home() / ".cache" / "duplex")
VENV = CACHE / f"vllm-{VLLM_VERSION}"
MARKER = VENV / ".duplex-vllm-ok"  # written by hack/setup-vllm.sh once `import vllm` works


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Everything here needs the vLLM virtualenv: selectable with -m vllm / -m "not vllm", marked or not.
    for item in items:
        if Path(str(item.fspath)).is_relative_to(Path(__file__).parent):
            item.add_marker(pytest.mark.vllm)


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    python = VENV / "bin" / "python"
    if python.exists() and MARKER.exists():
        return python
    reason = f"{VENV} has no python" if not python.exists() else f"{MARKER} is missing (an unfinished install?)"
    if _in_ci():
        pytest.fail(
            f"CI: the vLLM {VLLM_VERSION} virtualenv is missing ({reason}). .ci/run must run "
            "hack/setup-vllm.sh before the vLLM tier; this is a failure, not a skip.",
            pytrace=False,
        )
    pytest.fail(
        f"the vLLM {VLLM_VERSION} virtualenv is missing ({reason}): run hack/setup-vllm.sh "
        "(about 3 minutes and 9 GB once), then re-run the tests",
        pytrace=False,
    )


@dataclass
class CheckRun:
    returncode: int
    results: list[dict[str, Any]]
    stderr: str
    seconds: float

    def by_name(self) -> dict[str, dict[str, Any]]:
        return {r["name"]: r for r in self.results}


@pytest.fixture(scope="session")
def vllm_check(vllm_python: Path):
    """Runs hack/vllm_check.py in the vLLM virtualenv on [{name, argv, device?}, ...]."""

    def run(entries: list[dict[str, Any]]) -> CheckRun:
        started = time.monotonic()
        proc = subprocess.run(
            [str(vllm_python), str(CHECKER)],
            input=json.dumps(entries),
            capture_output=True,
            text=True,
            timeout=540,
            cwd=ROOT,
        )
        seconds = time.monotonic() - started
        try:
            results = json.loads(proc.stdout)
        except json.JSONDecodeError:
            pytest.fail(
                f"hack/vllm_check.py printed no JSON (exit {proc.returncode}); stderr tail:\n{proc.stderr[-4000:]}",
                pytrace=False,
            )
        return CheckRun(proc.returncode, results, proc.stderr, seconds)

    return run

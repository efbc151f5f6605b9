"""The binaries the chart, monitoring and GitOps tests run (helm, promtool, glua) and `helm template` of the chart.

Every one is built by hack/build-tools.sh into a version-keyed cache; a missing one fails the test with that hint,
in CI as anywhere else (the fix is one command)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from duplex_dev.cluster import tools
from duplex_dev.versions import version

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "duplex"
CACHE = Path(os.environ.get("DUPLEX_CACHE") or Path.home() / ".cache" / "duplex")
K8S_VERSION = version("K8S_VERSION")
HINT = "run `bash hack/build-tools.sh` (hack/setup.sh runs it); it builds and caches the pinned tools"


def _executable(path: Path, what: str) -> Path:
    if not os.access(path, os.X_OK):
        pytest.fail(f"{what} is missing at {path}: {HINT}", pytrace=False)
    return path


def helm() -> Path:
    try:
        bin_dir = tools.locate(None)
    except tools.ToolsMissing as err:
        pytest.fail(f"the control plane binaries (with helm) are missing ({err}): {HINT}", pytrace=False)
    return _executable(bin_dir / "helm", "helm")


def promtool() -> Path:
    return _executable(CACHE / f"promtool-{version('PROMTOOL_VERSION')}" / "promtool", "promtool")


def glua() -> Path:
    return _executable(CACHE / f"glua-{version('GOPHER_LUA_VERSION')}" / "glua", "glua (gopher-lua)")


def run(argv: list[str | Path], check: bool = True, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=120, check=False, **kwargs)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, argv))} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


def values_args(values: dict[str, Any] | None, tmp_dir: Path) -> list[str]:
    if not values:
        return []
    path = tmp_dir / f"values-{abs(hash(repr(values)))}.yaml"
    path.write_text(yaml.safe_dump(values))
    return ["-f", str(path)]


def render(
    tmp_dir: Path,
    values: dict[str, Any] | None = None,
    release: str = "duplex",
    namespace: str = "duplex-system",
    chart: Path = CHART,
) -> list[dict[str, Any]]:
    """`helm template` of the chart for the control plane's Kubernetes version: the rendered objects."""
    argv = [helm(), "template", release, chart, "-n", namespace, "--kube-version", K8S_VERSION]
    out = run([*argv, *values_args(values, tmp_dir)]).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def by_kind(objs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == kind]


def one(objs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = by_kind(objs, kind)
    assert len(found) == 1, f"expected one {kind}, found {[o['metadata']['name'] for o in found]}"
    return found[0]

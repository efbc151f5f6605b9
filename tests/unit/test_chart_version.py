"""The chart's version, appVersion and default image tag are the project version, whose one source is
pyproject.toml's [project].version."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "observability"))

import tooling  # noqa: E402

PROJECT_VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def test_chart_version_and_app_version_are_the_project_version() -> None:
    chart = yaml.safe_load((tooling.CHART / "Chart.yaml").read_text())
    assert chart["version"] == PROJECT_VERSION
    assert chart["appVersion"] == PROJECT_VERSION


def test_default_image_is_the_project_image_at_the_project_version(tmp_path: Path) -> None:
    values = yaml.safe_load((tooling.CHART / "values.yaml").read_text())
    assert values["image"]["tag"] == "", "an empty tag means the chart's appVersion; pin it there, not here"
    deployment = tooling.one(tooling.render(tmp_path), "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"] == f"ghcr.io/duplex-dev/duplex:{PROJECT_VERSION}"
    assert deployment["metadata"]["labels"]["app.kubernetes.io/version"] == PROJECT_VERSION

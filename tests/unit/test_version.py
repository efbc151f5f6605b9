"""One version everywhere: pyproject.toml's `version` is the source, and every place that names a duplex version or
image tag derives it (the installed package, `duplex --version`, the CRD's default router image, the image tag)."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import yaml

import duplex
from duplex.crd_cli import CRD_FILE

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT_VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
IMAGE_REPOSITORY = "ghcr.io/duplex-dev/duplex"


def committed_crd_router_image_defaults() -> list[str]:
    """Both places the committed CRD defaults router.image: the field's own default and the router object's."""
    crd = yaml.safe_load((ROOT / "crds" / CRD_FILE).read_text())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    router = spec["router"]
    return [router["properties"]["image"]["default"], router["default"]["image"]]


def test_installed_package_has_pyprojects_version():
    # A stale editable install (pyproject bumped, `make setup` not rerun) fails here rather than mislabelling things.
    assert duplex.__version__ == PYPROJECT_VERSION


def test_duplex_version_prints_pyprojects_version():
    out = subprocess.run(
        [sys.executable, "-m", "duplex.cli", "--version"], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == PYPROJECT_VERSION


def test_default_router_image_is_tagged_with_the_version():
    tagged = f"{IMAGE_REPOSITORY}:{PYPROJECT_VERSION}"
    assert tagged == duplex.IMAGE
    assert committed_crd_router_image_defaults() == [duplex.IMAGE, duplex.IMAGE], "crds/ is stale: run `make crds`"


# Further places that carry the version join here as they appear (the Helm chart's appVersion and its default
# image tag): read them from their files and assert they equal PYPROJECT_VERSION, like the tests above.

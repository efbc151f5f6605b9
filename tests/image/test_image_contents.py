"""What the built image holds and how it starts: the `duplex` console script as its entry point, the package's one
version, a fixed unprivileged user, no compiler, pip or package manager, no dev tooling, and nothing that user can
write but /tmp."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from working_container import WorkingContainer, image_config

import duplex
from duplex.crd_cli import CRD_FILE

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT_VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
USER = "65532:65532"


def test_tagged_and_labelled_with_pyprojects_version(image: str):
    assert image == duplex.IMAGE == f"ghcr.io/duplex-dev/duplex:{PYPROJECT_VERSION}"
    assert image_config(image)["Labels"]["org.opencontainers.image.version"] == PYPROJECT_VERSION


def test_entry_point_is_the_duplex_console_script(image: str, container: WorkingContainer):
    config = image_config(image)
    assert config["Entrypoint"] == ["/opt/duplex/app/bin/duplex"]
    result = container.run(*config["Entrypoint"], "--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == PYPROJECT_VERSION


@pytest.mark.parametrize("command", ["operator", "router", "sim", "render", "crds", "preflight"])
def test_every_command_answers_help(container: WorkingContainer, command: str):
    result = container.run("duplex", command, "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"usage: duplex {command}")


def test_the_images_crd_is_the_committed_one(container: WorkingContainer):
    # The models in the image are the ones in the tree (a stale image or a missed `make crds` fails here).
    result = container.run("duplex", "crds")
    assert result.returncode == 0, result.stderr
    assert result.stdout == (ROOT / "crds" / CRD_FILE).read_text()


def test_operator_router_and_nixl_modules_import(container: WorkingContainer):
    # What `--help` does not load: the operator's kopf handlers and Kubernetes client (the image drops
    # kubernetes.aio), the router's EndpointSlice discovery, and nixl's bindings with its bundled UCX.
    modules = "duplex.handlers, duplex.kube, duplex_sidecars.router.endpointslices, nixl_cu12._api"
    result = container.run("python3", "-c", f"import {modules}")
    assert result.returncode == 0, result.stderr


def test_runs_as_the_fixed_unprivileged_user(image: str, container: WorkingContainer):
    assert image_config(image)["User"] == USER
    result = container.run("id")  # no --user: the image's own
    assert result.stdout.split()[:2] == ["uid=65532(duplex)", "gid=65532(duplex)"], result.stdout


def test_no_compiler_pip_or_package_manager(container: WorkingContainer):
    tools = ["gcc", "cc", "c++", "g++", "clang", "ld", "make", "pip", "pip3", "apt", "apt-get", "dpkg", "dpkg-deb"]
    found = container.run("sh", "-c", 'for tool in "$@"; do command -v "$tool"; done; true', "sh", *tools)
    assert found.stdout.split() == [], f"on the image's PATH: {found.stdout.split()}"
    for module in ("pip", "ensurepip", "setuptools"):
        result = container.run("python3", "-c", f"import {module}")
        assert f"No module named '{module}'" in result.stderr, (module, result.stderr)


def test_only_the_product_distribution_is_installed(container: WorkingContainer):
    result = container.run("python3", "-c", "import duplex_dev")
    assert "No module named 'duplex_dev'" in result.stderr, result.stderr
    listed = container.run(
        "python3", "-c", "import importlib.metadata as m; print(*sorted(d.metadata['Name'] for d in m.distributions()))"
    )
    installed = set(listed.stdout.split())
    assert {"duplex", "nixl-cu12", "kopf", "kubernetes"} <= installed
    assert not installed & {"duplex-dev", "pytest", "hypothesis", "ruff", "mypy", "pip", "setuptools", "torch"}


def test_nothing_but_tmp_is_writable_by_the_user(image: str, container: WorkingContainer):
    assert image_config(image)["Volumes"] == {"/tmp": {}}
    writable = container.run("find", "/", "-xdev", "-writable", "-print")
    assert writable.stdout.split() == ["/tmp"]
    result = container.run("touch", "/opt/duplex/app/planted.py")
    assert "Permission denied" in result.stderr, result.stderr


def test_all_bytecode_is_compiled_in(container: WorkingContainer):
    # On a read-only root nothing can cache bytecode later: a module without it would be recompiled on every start.
    script = (
        "import importlib.util, pathlib\n"
        "sources = [p for p in pathlib.Path('/opt/duplex').rglob('*.py')]\n"
        "missing = [str(p) for p in sources if not pathlib.Path(importlib.util.cache_from_source(p)).exists()]\n"
        "print(len(sources), *missing[:20])\n"
    )
    result = container.run("python3", "-c", script)
    assert result.returncode == 0, result.stderr
    total, *missing = result.stdout.split()
    assert int(total) > 1000
    assert missing == []


def test_read_only_root_refuses_even_root(read_only_container: WorkingContainer):
    # The premise of test_image_serving: the root filesystem of that container cannot be written at all.
    result = read_only_container.run("touch", "/opt/duplex/planted", user="0:0")
    assert "Read-only file system" in result.stderr, result.stderr
    result = read_only_container.run("sh", "-c", "echo ok > /tmp/probe && cat /tmp/probe")
    assert result.stdout.strip() == "ok", result.stderr

"""Fixtures for the image tier: the duplex image as hack/build-image.sh builds it (`make image`; nothing to do when it
is current) and working containers of it, one as built and one with its root filesystem read-only.

buildah or mmdebstrap missing is a failure, never a skip: hack/setup.sh installs both from Debian."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from working_container import WorkingContainer

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
BUILD = ROOT / "hack" / "build-image.sh"
# A cold build on two busy cores: the base about 1 minute, the dependencies 1 to 5 (measured); `make test` builds
# before pytest starts, so this matters only when the tier runs alone.
BUILD_TIMEOUT = 1800.0


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Everything here needs the built image: selectable with -m image / -m "not image", marked or not.
    for item in items:
        if Path(str(item.fspath)).is_relative_to(HERE):
            item.add_marker(pytest.mark.image)
            item.add_marker(pytest.mark.timeout(BUILD_TIMEOUT + 300))


@pytest.fixture(scope="session")
def image(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The image's name (duplex.IMAGE), built or confirmed current by hack/build-image.sh."""
    missing = [tool for tool in ("buildah", "mmdebstrap") if shutil.which(tool) is None]
    if missing:
        pytest.fail(
            f"{' and '.join(missing)} missing: run hack/setup.sh (it installs the Debian packages buildah and "
            "mmdebstrap); the image tier builds and runs the real image, it is never skipped",
            pytrace=False,
        )
    if os.geteuid() != 0:
        pytest.fail("the image tier needs root (buildah's root storage, mmdebstrap --mode=root)", pytrace=False)
    log = tmp_path_factory.mktemp("image") / "build-image.log"
    with open(log, "w") as err:
        proc = subprocess.run(
            ["bash", str(BUILD)],
            cwd=ROOT,
            env={**os.environ, "PY": sys.executable},
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            timeout=BUILD_TIMEOUT,
            check=False,
        )
    if proc.returncode != 0:
        tail = "\n".join(log.read_text().splitlines()[-40:])
        pytest.fail(f"hack/build-image.sh exited {proc.returncode}; log {log}:\n{tail}", pytrace=False)
    return proc.stdout.split()[-1]


@pytest.fixture(scope="session")
def container(image: str) -> Iterator[WorkingContainer]:
    """A working container of the image as built."""
    made = WorkingContainer(image)
    try:
        yield made
    finally:
        made.remove()


@pytest.fixture(scope="session")
def read_only_container(image: str) -> Iterator[WorkingContainer]:
    """A working container of the image whose root filesystem is mounted read-only; /tmp is its declared volume."""
    made = WorkingContainer(image)
    try:
        made.make_root_read_only()
        yield made
    finally:
        made.remove()

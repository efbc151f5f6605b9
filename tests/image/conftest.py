"""Fixtures for the image tier: working containers of the duplex image (the `image` fixture of tests/conftest.py,
which the e2e tier shares), one as built and one with its root filesystem read-only."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from working_container import WorkingContainer

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Everything here needs the built image: selectable with -m image / -m "not image", marked or not.
    for item in items:
        if Path(str(item.fspath)).is_relative_to(HERE):
            item.add_marker(pytest.mark.image)
            item.add_marker(pytest.mark.timeout(2100))  # a cold build of the image (tests/conftest.py) and more


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

"""The fake_root fixture: an empty tree to build a pod's filesystem in (see trees.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from .trees import FakeRoot


@pytest.fixture
def fake_root(tmp_path: Path) -> FakeRoot:
    root = tmp_path / "root"
    root.mkdir()
    return FakeRoot(root)

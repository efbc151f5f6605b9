"""Fixtures of the operator unit tier: pure functions only, no cluster, no network."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

# The helpers module sits beside the tests; make it importable whatever pytest's import mode.
sys.path.insert(0, str(Path(__file__).parent))

import dsv_helpers


@pytest.fixture
def seed_doc() -> dict[str, Any]:
    return dsv_helpers.load(dsv_helpers.SEED)


@pytest.fixture
def trainium_doc() -> dict[str, Any]:
    return dsv_helpers.load(dsv_helpers.TRAINIUM)

"""The monitoring and GitOps tier: promtool over the chart's alerts, glua (Argo CD's Lua) over its health check,
and the metric names the dashboard and alerts query against real scrapes. Helpers sit beside the tests."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if Path(str(item.fspath)).is_relative_to(here):
            item.add_marker(pytest.mark.observability)

"""The Argo CD health check (charts/duplex/files/argocd-health.lua) in gopher-lua, the interpreter Argo CD embeds,
over DisaggregatedServing objects captured from the real operator (tests/fixtures/dsv-status/, regenerated and
checked for drift by tests/integration/test_gitops_health.py)."""

from __future__ import annotations

import copy
import json

import pytest
from argocd_health import EXPECTED, FIXTURES, health


@pytest.mark.parametrize("fixture", sorted(EXPECTED))
def test_captured_objects(fixture: str) -> None:
    obj = json.loads((FIXTURES / f"{fixture}.json").read_text())
    status, message = health(obj)
    assert status == EXPECTED[fixture], (fixture, status, message)
    assert message


def test_every_fixture_has_an_expectation() -> None:
    assert {p.stem for p in FIXTURES.glob("*.json")} == set(EXPECTED)


def test_a_spec_change_not_yet_observed_is_progressing() -> None:
    obj = json.loads((FIXTURES / "healthy.json").read_text())
    obj["metadata"]["generation"] = obj["status"]["observedGeneration"] + 1
    status, message = health(obj)
    assert status == "Progressing" and "generation" in message


def test_status_without_conditions_is_progressing() -> None:
    obj = json.loads((FIXTURES / "healthy.json").read_text())
    obj = copy.deepcopy(obj)
    obj["status"].pop("conditions")
    assert health(obj)[0] == "Progressing"


def test_the_script_uses_nothing_beyond_argo_cds_sandbox() -> None:
    """health() runs the script with only Lua's base functions, table and string (no os, io, require, debug)."""
    obj = json.loads((FIXTURES / "healthy.json").read_text())
    assert health(obj, extra_lua="assert(os == nil and io == nil and require == nil)")[0] == "Healthy"

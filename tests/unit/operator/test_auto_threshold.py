"""recomputeThreshold: Auto: the routers' measurements -> the router's threshold, held within the margin and the
interval; and one sync pass that puts it into the router's ConfigMap, never into the engines'."""

from __future__ import annotations

import json
from typing import Any

import pytest
from dsv_helpers import spec
from sync_helpers import observed, parent

from duplex import status as status_of
from duplex.api.status import EffectiveKV, RecomputeCalibration
from duplex.auto_threshold import decide
from duplex.children.kv_config import engine_threshold, kv_transfer_config
from duplex.render import InvalidSpec
from duplex.sync import sync

T0 = "2026-12-02T10:00:00Z"
T1 = "2026-12-02T10:05:00Z"  # within the default 600 s interval
T2 = "2026-12-02T10:20:00Z"
AUTO = {"kvTransfer": {"recomputeThreshold": "Auto"}}


def fit(threshold: int | None, recomputes: int = 40, replays: int = 40) -> dict[str, Any]:
    return {"compute_seconds_per_token": 5.5e-3, "read_seconds_per_token": 1.5e-5, "replay_overhead_seconds": 0.57,
            "recomputes": recomputes, "replays": replays, "threshold": threshold}  # fmt: skip


def reports(*fits: dict[str, Any] | None, at: str = T0) -> dict[str, str]:
    return {f"demo-router-{i}": json.dumps({"healthy": True, "calibration": f, "at": at}) for i, f in enumerate(fits)}


def last(value: int, changed_at: str | None) -> EffectiveKV:
    return EffectiveKV(
        recompute_threshold=value, recompute_calibration=RecomputeCalibration(reason="Measured", changed_at=changed_at)
    )


def test_a_fixed_threshold_decides_nothing():
    assert decide(spec(), None, reports(fit(104)), T0) is None


def test_before_any_measurement_the_initial_value_applies():
    d = decide(spec(AUTO), None, reports(None, fit(104, replays=3)), T0)  # no fit, and one with too few replays
    assert d is not None and d.value == 64 and d.calibration.reason == "Initial" and d.calibration.changed_at is None


def test_the_median_break_even_of_the_routers_applies_at_once():
    d = decide(spec(AUTO), None, reports(fit(104), fit(90), fit(300)), T0)
    assert d is not None and d.value == 104
    c = d.calibration
    assert (c.reason, c.measured_threshold, c.routers, c.samples, c.changed_at) == ("Measured", 104, 3, 240, T0)
    assert c.compute_seconds_per_token == 5.5e-3 and "64 -> 104 tokens" in c.message


@pytest.mark.parametrize(
    "threshold, expected", [(3, 16), (10**6, 8192), (None, 8192)], ids=["below floor", "above ceiling", "never pays"]
)
def test_the_value_stays_within_the_bounds(threshold, expected):
    d = decide(spec(AUTO), None, reports(fit(threshold)), T0)
    assert d is not None and d.value == expected


def test_a_change_within_the_margin_is_not_made():
    d = decide(spec(AUTO), last(100, T0), reports(fit(120), at=T2), T2)
    assert d is not None and d.value == 100 and d.calibration.reason == "WithinMargin"
    assert d.calibration.changed_at == T0


def test_a_second_change_waits_for_the_interval():
    d = decide(spec(AUTO), last(100, T0), reports(fit(300), at=T1), T1)
    assert (
        d is not None and d.value == 100 and d.calibration.reason == "Waiting" and "300 s more" in d.calibration.message
    )
    d = decide(spec(AUTO), last(100, T0), reports(fit(300), at=T2), T2)
    assert d is not None and d.value == 300 and d.calibration.changed_at == T2


def test_reports_that_aged_out_keep_the_value():
    d = decide(spec(AUTO), last(300, T0), reports(fit(104), at=T0), "2026-12-02T11:00:00Z")
    assert d is not None and d.value == 300 and d.calibration.reason == "NotMeasured"


def test_the_engines_keep_the_floor_so_a_new_value_restarts_nothing():
    s = spec({"kvTransfer": {"recomputeThreshold": "Auto", "recomputeCalibration": {"minTokens": 32}}})
    assert engine_threshold(s) == 32
    assert kv_transfer_config(s, "prefill")["kv_connector_extra_config"]["kv_recompute_threshold"] == 32


@pytest.mark.parametrize(
    "kv",
    [
        {"recomputeThreshold": "auto"},
        {"recomputeThreshold": "64"},
        {"recomputeThreshold": -1},
        {"recomputeThreshold": 1_048_577},
    ],
)
def test_anything_but_auto_or_a_token_count_is_refused(kv):
    with pytest.raises(InvalidSpec, match="must be Auto or a number of tokens from 0 to 1048576"):
        spec({"kvTransfer": kv})


def test_bounds_out_of_order_are_refused():
    with pytest.raises(InvalidSpec, match="minTokens <= initial <= maxTokens"):
        spec({"kvTransfer": {"recomputeCalibration": {"initial": 8}}})


def _router_config(result) -> dict[str, Any]:
    (cm,) = [o for o in result.apply if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "demo-router"]
    return json.loads(cm["data"]["router.json"])


def test_a_sync_pass_puts_the_measured_value_into_the_routers_config_only():
    p = parent(AUTO)
    live = observed(p)
    fabric = next(o for o in live if o["metadata"]["name"] == "demo-fabric")
    fabric["data"] = reports(fit(104))
    result = sync(p, live, None, at=T0)
    assert _router_config(result)["reuse"]["min_tokens"] == 104
    assert {o["kind"] for o in result.apply} == {"ConfigMap"}  # no Deployment rolls
    kv = status_of.patch_body(result.status)["effectiveKV"]
    assert kv["recomputeThreshold"] == 104 and kv["engineRecomputeThreshold"] == 16
    assert kv["recomputeCalibration"]["reason"] == "Measured"
    again = sync(p, live, status_of.patch_body(result.status), at=T1)  # the next pass holds it
    assert again.status.effective_kv.recompute_threshold == 104

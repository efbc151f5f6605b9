"""router/leg_costs.py: a prefill leg's expected compute from its body size and what it reuses, at rates from the
placement config until the calibration has a fit, and then from the fit."""

import pytest

from duplex_sidecars.router import leg_costs
from duplex_sidecars.router.calibration import Calibration
from duplex_sidecars.router.config import PlacementConfig
from duplex_sidecars.router.leg_costs import LegCosts

PLACEMENT = PlacementConfig(prefill="cost", compute_ms_per_1k_tokens=100, read_latency_ms=2)


def test_until_an_engine_answers_a_token_is_four_bytes_at_the_configured_rate():
    costs = LegCosts(PLACEMENT)
    assert costs.leg_seconds(40_000, 0) == pytest.approx(10_000 * 0.0001)
    assert costs.leg_seconds(40_000, 8_000) == pytest.approx(2_000 * 0.0001)
    assert costs.leg_seconds(4_000, 8_000) == 0.0  # reusing more than the estimate: nothing left to compute


def test_tokens_per_byte_follows_what_engines_report():
    costs = LegCosts(PLACEMENT)
    for _ in range(100):
        costs.observe(10_000, {"prompt_tokens": 2_000})
    assert costs.tokens_per_byte == pytest.approx(0.2, rel=1e-3)
    costs.observe(10_000, {"no": "usage"})
    costs.observe(0, {"prompt_tokens": 5})
    assert costs.tokens_per_byte == pytest.approx(0.2, rel=1e-3)


def _calibrated() -> Calibration:
    """Legs of a known cost: 2 ms a computed token, 0.01 ms a read one, 0.3 s a read's fixed part."""
    cal = Calibration(window=256, min_samples=8)
    for i in range(40):
        computed = 500 + 100 * (i % 7)
        read = 0 if i % 2 else 1000 + 250 * (i % 5)
        seconds = 0.05 + 0.002 * computed + (0.3 + 1e-5 * read if read else 0.0)
        cal.observe({"prompt_tokens": computed + read}, read, seconds)
    return cal


def test_the_calibration_fit_replaces_the_configured_rates(monkeypatch):
    costs = LegCosts(PLACEMENT, _calibrated())
    rates = costs.rates()
    assert rates.calibrated
    assert rates.compute_per_token == pytest.approx(0.002, rel=0.01)
    assert rates.read_latency == pytest.approx(0.3, rel=0.05)
    assert costs.describe()["compute_ms_per_1k_tokens"] == pytest.approx(2000, rel=0.01)


def test_without_a_fit_or_when_told_not_to_the_configured_rates_stay():
    assert not LegCosts(PLACEMENT, Calibration()).rates().calibrated
    fixed = PLACEMENT.model_copy(update={"calibrated": False})
    assert LegCosts(fixed, _calibrated()).rates().compute_per_token == pytest.approx(0.0001)


def test_the_fit_is_refreshed_at_most_every_few_seconds(monkeypatch):
    cal = Calibration(window=256, min_samples=8)
    costs = LegCosts(PLACEMENT, cal)
    now = [1000.0]
    monkeypatch.setattr(leg_costs.time, "monotonic", lambda: now[0])
    assert not costs.rates().calibrated  # no fit yet: the config
    for i in range(40):
        computed, read = 500 + 100 * (i % 7), (0 if i % 2 else 1000 + 250 * (i % 5))
        cal.observe({"prompt_tokens": computed + read}, read, 0.05 + 0.002 * computed + (0.3 if read else 0.0))
    assert not costs.rates().calibrated  # fitted, but not looked at again yet
    now[0] += leg_costs.REFRESH_SECONDS + 1
    assert costs.rates().calibrated

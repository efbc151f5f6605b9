"""The cost model: zero by default, linear plus attention for prefill, bandwidth for transfers."""

import pytest

from duplex_sidecars.sim.cost import CostModel


def test_defaults_cost_nothing():
    c = CostModel()
    assert c.prefill_seconds(10_000, 10_000) == c.decode_seconds() == c.transfer_seconds(1 << 30) == 0.0


def test_prefill_grows_with_context():
    c = CostModel(prefill_us_per_token=10, prefill_attention_us_per_token2=0.01)
    assert c.prefill_seconds(0, 500) == 0.0
    assert c.prefill_seconds(100, 1000) > c.prefill_seconds(100, 0) > 100 * 10 / 1e6
    assert c.prefill_seconds(100, 0) == pytest.approx((1000 + 0.01 * 100 * 101 / 2) / 1e6)


def test_decode_and_transfer():
    c = CostModel(decode_us_per_token=2000, transfer_gbps=8)
    assert c.decode_seconds(3) == pytest.approx(0.006)
    assert c.transfer_seconds(10**9) == pytest.approx(1.0)

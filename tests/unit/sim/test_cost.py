"""The cost model: zero by default, linear plus attention for prefill, bandwidth and a fixed part for reads, and
profiles fitted to real engines (bench/sim_cost_fit.py)."""

import json
import re
from pathlib import Path

import pytest

from duplex_sidecars.sim.cost import CostModel, load_profile

PROFILE = Path(__file__).resolve().parents[3] / "bench/results/sim-cost.json"


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


def test_only_a_read_back_pays_the_fixed_part():
    c = CostModel(transfer_gbps=8, read_back_latency_us=100_000)
    assert c.read_seconds(10**9, read_back=False) == pytest.approx(1.0)
    assert c.read_seconds(10**9, read_back=True) == pytest.approx(1.1)


def test_scaled_keeps_the_ratios_and_shrinks_every_duration():
    c = CostModel(
        prefill_us_per_token=3000,
        prefill_attention_us_per_token2=0.75,
        decode_us_per_token=50_000,
        transfer_gbps=8,
        read_back_latency_us=100_000,
    )
    fast = c.scaled(0.1)
    assert fast.prefill_seconds(500, 2000) == pytest.approx(c.prefill_seconds(500, 2000) / 10)
    assert fast.decode_seconds(3) == pytest.approx(c.decode_seconds(3) / 10)
    assert fast.read_seconds(10**8, read_back=True) == pytest.approx(c.read_seconds(10**8, read_back=True) / 10)
    with pytest.raises(ValueError):
        c.scaled(0)


def test_a_profile_is_the_cost_object_of_a_json_file(tmp_path):
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"command": "x", "cost": {"prefill_us_per_token": 3000, "read_back_latency_us": 9e4}}))
    assert load_profile(path) == CostModel(prefill_us_per_token=3000, read_back_latency_us=90_000)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", "cost profile"),
        ('{"fit": {}}', "no `cost` object"),
        ('{"cost": {"prefill_us": 1}}', "unknown fields ['prefill_us']"),
        ('{"cost": {"decode_us_per_token": -1}}', "must be numbers >= 0"),
        ('{"cost": {"decode_us_per_token": "fast"}}', "must be numbers >= 0"),
    ],
)
def test_a_bad_profile_names_what_is_wrong(tmp_path, text, message):
    path = tmp_path / "p.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=re.escape(message)):
        load_profile(path)


def test_the_committed_profile_loads_and_costs_something():
    cost = load_profile(PROFILE)
    assert cost.prefill_seconds(1000, 0) > 0 and cost.decode_seconds() > 0 and cost.transfer_gbps > 0

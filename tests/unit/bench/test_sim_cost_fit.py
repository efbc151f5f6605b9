"""bench/sim_cost_fit.py: the fit recovers a known cost model from legs it generated, never goes negative, and says
why a replayed turn was slower than recomputing."""

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))

import sim_cost_fit as fit

from duplex_sidecars.sim.cost import CostModel

TRUTH = CostModel(prefill_us_per_token=3000, prefill_attention_us_per_token2=0.75, decode_us_per_token=50_000,
                  transfer_gbps=8, read_back_latency_us=100_000)  # fmt: skip
BYTES_PER_TOKEN = 16_384


def _sample(contender, turn, computed, local=0, external=0, threshold=None, noise=1.0):
    read_bytes = external * BYTES_PER_TOKEN
    leg = TRUTH.prefill_seconds(computed, local + external)
    read_s = TRUTH.transfer_seconds(read_bytes) if external else 0.0
    if external:
        leg += TRUTH.read_seconds(read_bytes, read_back=True)
    ttft = leg * noise + 0.1
    return {"contender": contender, "topology": "1P1D", "round": 0, "conv": "c0", "turn": turn,
            "threshold": threshold, "replayed": contender == "duplex" and turn > 0, "prompt_tokens": computed + local
            + external, "completion_tokens": 11, "wall_s": ttft + 0.5, "ttft_s": ttft, "prefill_leg_s": leg * noise,
            "computed_tokens": computed, "local_tokens": local, "external_tokens": external,
            "reads": 1.0 if external else 0.0, "read_s": read_s, "read_bytes": read_bytes}  # fmt: skip


def _run():
    samples = []
    for turn, n in enumerate(range(800, 5000, 400)):
        samples.append(_sample("recompute", turn, n))
        samples.append(_sample("oracle", turn, 600, local=n - 600))
        samples.append(_sample("duplex", turn, 600, external=n - 600))
    return {"samples": samples, "sweep": []}


def test_the_fit_recovers_the_model_that_made_the_legs():
    cost = fit.fit(_run())["cost"]
    assert cost.prefill_us_per_token == pytest.approx(3000, rel=1e-6)
    assert cost.prefill_attention_us_per_token2 == pytest.approx(0.75, rel=1e-6)
    assert cost.read_back_latency_us == pytest.approx(100_000, rel=1e-6)
    assert cost.transfer_gbps == pytest.approx(8, rel=1e-6)
    assert cost.decode_us_per_token == pytest.approx(50_000, rel=1e-6)
    assert fit.errors(cost, fit.legs(_run()))["all"]["p90"] == pytest.approx(0, abs=1e-9)


def test_a_coefficient_the_data_would_make_negative_is_zero_instead():
    x = np.array([[1.0, 1.0], [2.0, 1.0], [3.0, 1.0]])
    y = np.array([3.0, 2.0, 1.0])  # falling: a negative slope; the intercept alone fits what is left
    coef = fit.nonnegative_fit(x, y)
    assert (coef >= 0).all() and coef[0] == 0 and coef[1] == pytest.approx(2.0)


def test_a_run_without_reads_cannot_be_fitted():
    run = {"samples": [s for s in _run()["samples"] if s["contender"] != "duplex"]}
    with pytest.raises(SystemExit, match="nothing to fit a read to"):
        fit.fit(run)


def test_a_replayed_turn_slower_than_recompute_is_explained():
    run = _run()
    run["sweep"] = [_sample("recompute", 1, 900, threshold=1024, noise=0.5),
                    _sample("duplex", 1, 900, threshold=1024)]  # fmt: skip
    (slow,) = fit.slower_turns(TRUTH, run)
    assert slow["threshold"] == 1024 and "fell under the threshold" in slow["why"]


def test_it_writes_a_profile_the_simulator_loads(tmp_path, monkeypatch):
    import json

    from duplex_sidecars.sim.cost import load_profile

    source = tmp_path / "ttft.json"
    source.write_text(json.dumps(_run()))
    assert fit.main(["--ttft", str(source), "--out", str(tmp_path / "sim-cost")]) == 0
    assert load_profile(tmp_path / "sim-cost.json").prefill_us_per_token == pytest.approx(3000, rel=1e-4)
    assert "Break-even" in (tmp_path / "sim-cost.md").read_text()

"""The fit of what a computed and a read token cost, from prefill legs of a known cost model."""

from __future__ import annotations

import random

import pytest

from duplex_sidecars.router.calibration import Calibration, break_even, tokens_of

# seconds = BASE + COMPUTE * computed + READ * read + OVERHEAD * replayed: about the TTFT benchmark's fit on CPU
BASE, COMPUTE, READ, OVERHEAD = 0.02, 5.5e-3, 1.5e-5, 0.57


def leg(computed: int, read: int, noise: float = 0.0, rng: random.Random | None = None) -> float:
    seconds = BASE + COMPUTE * computed + READ * read + (OVERHEAD if read else 0.0)
    return seconds * (1 + (rng.uniform(-noise, noise) if rng else 0.0))


def usage(prompt: int, cached: int | None = None) -> dict:
    out: dict = {"prompt_tokens": prompt, "completion_tokens": 1}
    if cached is not None:
        out["prompt_tokens_details"] = {"cached_tokens": cached}
    return out


def feed(cal: Calibration, n: int, rng: random.Random, noise: float = 0.0) -> None:
    for _ in range(n):
        history, new = rng.randint(100, 6000), rng.randint(20, 400)
        cal.observe(usage(history + new), 0, leg(history + new, 0, noise, rng))  # a miss computes it all
        cal.observe(usage(history + new, cached=history), history, leg(new, history, noise, rng))  # a replay


def test_the_fit_recovers_the_cost_model_and_its_break_even():
    cal = Calibration(window=512, min_samples=16)
    feed(cal, 100, random.Random(7), noise=0.05)
    fit = cal.fit()
    assert fit is not None and fit.recomputes == fit.replays == 100
    assert fit.compute_seconds_per_token == pytest.approx(COMPUTE, rel=0.05)
    assert fit.replay_overhead_seconds == pytest.approx(OVERHEAD, rel=0.3)
    assert fit.threshold == pytest.approx(OVERHEAD / (COMPUTE - READ), rel=0.3)  # ~104 tokens
    assert fit.report()["threshold"] == fit.threshold
    assert 0 < fit.noise < 0.05  # the legs were drawn within 5% of the model


def test_no_fit_until_both_kinds_of_leg_are_seen_enough():
    cal = Calibration(window=512, min_samples=16)
    rng = random.Random(1)
    for _ in range(100):
        n = rng.randint(100, 5000)
        cal.observe(usage(n), 0, leg(n, 0))
    assert cal.fit() is None  # recomputes only: nothing says what a read costs
    feed(cal, 15, rng)
    assert cal.fit() is None
    feed(cal, 1, rng)
    assert cal.fit() is not None


def test_sizes_that_never_vary_give_no_fit():
    cal = Calibration(min_samples=4)
    for _ in range(50):
        cal.observe(usage(1000), 0, leg(1000, 0))
        cal.observe(usage(1000), 900, leg(100, 900))
    assert cal.fit() is None


def test_the_window_keeps_the_latest_legs():
    cal = Calibration(window=64, min_samples=8)
    rng = random.Random(3)
    for _ in range(200):  # an older, slower machine
        n = rng.randint(100, 5000)
        cal.observe(usage(n), 0, 10 * leg(n, 0))
    feed(cal, 32, rng)
    fit = cal.fit()
    assert fit is not None and fit.compute_seconds_per_token == pytest.approx(COMPUTE, rel=1e-6)


@pytest.mark.parametrize(
    "compute, read, overhead, expected",
    [(5e-3, 1e-5, 0.5, 101), (5e-3, 1e-5, -0.1, 0), (1e-5, 5e-3, 0.5, None), (5e-3, -1e-4, 0.5, 100)],
)
def test_break_even(compute, read, overhead, expected):
    assert break_even(compute, read, overhead) == expected


@pytest.mark.parametrize(
    "doc, expected",
    [
        ({"prompt_tokens": 10}, (10, 0)),
        ({"prompt_tokens": 10, "prompt_tokens_details": {"cached_tokens": 4}}, (10, 4)),
        ({"input_tokens": 12, "output_tokens": 1}, (12, 0)),  # the Messages and Responses APIs
        ({"input_tokens": 12, "input_tokens_details": {"cached_tokens": 5}}, (12, 5)),
        ({"prompt_tokens": 10, "prompt_tokens_details": {"cached_tokens": 11}}, (10, 0)),  # not believable
        ({"prompt_tokens": 0}, None),
        ({"prompt_tokens": "10"}, None),
        (None, None),
        ("usage", None),
    ],
)
def test_tokens_of_a_legs_usage(doc, expected):
    assert tokens_of(doc) == expected


def test_a_replay_computes_what_was_neither_cached_nor_read():
    cal = Calibration(min_samples=4)
    cal.observe(usage(1000, cached=900), 900, 1.0)
    cal.observe(usage(1000), 900, 1.0)  # no details: what was read counts as cached
    cal.observe(usage(1000), 0, 0.0)  # a leg with no duration is not a sample
    assert list(cal._samples) == [(100.0, 900.0, 1.0, 1.0), (100.0, 900.0, 1.0, 1.0)]


def test_a_few_legs_far_off_the_rest_do_not_move_the_fit():
    cal = Calibration(min_samples=16)
    rng = random.Random(11)
    cal.observe(usage(200), 0, 48.0)  # a new pair's first handshake
    cal.observe(usage(200, cached=190), 190, 43.0)
    feed(cal, 40, rng, noise=0.05)
    fit = cal.fit()
    assert fit is not None and fit.replays == fit.recomputes == 40  # the two are left out
    assert fit.compute_seconds_per_token == pytest.approx(COMPUTE, rel=0.05)
    assert fit.replay_overhead_seconds == pytest.approx(OVERHEAD, rel=0.3)


def test_the_report_has_the_legs_before_and_with_a_fit():
    cal = Calibration(min_samples=16)
    assert cal.report() is None
    cal.observe(usage(100), 0, 0.6)
    assert cal.report() == {"legs": {"recomputes": 1, "replays": 0}}
    feed(cal, 20, random.Random(5))
    report = cal.report()
    assert report is not None and report["legs"] == {"recomputes": 21, "replays": 20} and report["threshold"] > 0

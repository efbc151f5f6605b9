"""The load the router reports for the operator's planner (router/load.py): each role's saturation over the last
minute, and the TTFT p90 read off the histogram's buckets the way Prometheus' histogram_quantile reads them."""

from __future__ import annotations

import math

import pytest

from duplex_sidecars.router.load import LoadWindow, histogram_buckets, quantile
from duplex_sidecars.router.metrics import RouterMetrics


def test_quantiles_interpolate_within_their_bucket() -> None:
    assert quantile(0.9, []) is None
    assert quantile(0.9, [(1.0, 0.0), (math.inf, 0.0)]) is None
    # 10 observations: 5 up to 1 s, 5 between 1 and 2.5 s: the 9th is 4/5 of the way through the second bucket
    assert quantile(0.9, [(1.0, 5.0), (2.5, 10.0), (math.inf, 10.0)]) == pytest.approx(2.2)
    assert quantile(0.5, [(1.0, 10.0), (math.inf, 10.0)]) == pytest.approx(0.5)
    assert quantile(0.9, [(1.0, 0.0), (math.inf, 4.0)]) == 1.0  # beyond the last bound: that bound


def test_the_window_averages_saturation_and_reads_ttft_over_its_own_minute() -> None:
    metrics = RouterMetrics()
    saturation = {"prefill": 0.5, "decode": math.nan}
    window = LoadWindow(
        lambda role: saturation[role],
        lambda role: 2 * saturation[role],  # two engines' worth of legs per unit of saturation
        lambda: histogram_buckets(metrics.ttft.metric.collect(), "duplex_router_time_to_first_token_seconds"),
    )
    metrics.ttft.labels("chat", "false", "miss").observe(30.0)  # before the window: not counted
    window.sample(now=0.0)
    assert window.summary() is None  # one sample says nothing yet
    saturation["prefill"] = 1.5
    for seconds in (0.2, 0.3, 0.4, 0.7, 3.0):
        metrics.ttft.labels("chat", "true", "hit").observe(seconds)
    window.sample(now=30.0)
    summary = window.summary()
    assert summary is not None
    assert summary["prefill"] == {"demand": 2.0, "saturation": 1.0, "peak": 1.5}
    assert "decode" not in summary  # slots unknown: no saturation
    assert summary["turns"] == 5 and 2.5 <= summary["ttft_p90"] <= 5.0
    window.sample(now=70.0)  # the first sample ages out
    assert window.summary() == {
        "seconds": 40.0,
        "prefill": {"demand": 3.0, "saturation": 1.5, "peak": 1.5},
        "turns": 0,
        "ttft_p90": None,
    }

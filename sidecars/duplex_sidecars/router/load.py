"""What the operator's planner scales on (operator/duplex/planner.py): each role's demand (legs in flight, in
engines' worth) and saturation averaged over the last minute, and the time to first token's 90th percentile over
the same minute, carried in the fabric report.

Nothing on the request path: saturation is sampled when the reporter checks (every few seconds), and TTFT comes from
the duplex_router_time_to_first_token_seconds histogram's buckets, as differences between samples (the way
Prometheus' histogram_quantile reads them).
"""

from __future__ import annotations

import collections
import math
import time
from collections.abc import Callable, Mapping
from typing import Any

WINDOW_SECONDS = 60.0
ROLES = ("prefill", "decode")


def quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """The q-quantile of cumulative bucket counts [(upper bound, count)], interpolated linearly within its bucket;
    None without observations. Beyond the last finite bound: that bound."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower, below = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if math.isinf(bound):
                return lower
            span = count - below
            return lower + (bound - lower) * ((rank - below) / span if span > 0 else 1.0)
        lower, below = bound, count
    return lower


class LoadWindow:
    """Samples of each role's saturation and of the TTFT histogram's buckets over the last WINDOW_SECONDS."""

    def __init__(
        self,
        saturation: Callable[[str], float],
        demand: Callable[[str], float],
        ttft_buckets: Callable[[], list[tuple[float, float]]],
        window: float = WINDOW_SECONDS,
    ):
        self._saturation = saturation
        self._demand = demand
        self._ttft_buckets = ttft_buckets
        self._window = window
        self._samples: collections.deque[
            tuple[float, dict[str, float], dict[str, float], list[tuple[float, float]]]
        ] = collections.deque()

    def sample(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        saturation = {r: self._saturation(r) for r in ROLES}
        self._samples.append((now, saturation, {r: self._demand(r) for r in ROLES}, self._ttft_buckets()))
        while self._samples and now - self._samples[0][0] > self._window:
            self._samples.popleft()

    def summary(self) -> dict[str, Any] | None:
        """{"seconds", "prefill": {"demand", "saturation", "peak"}, "decode": {...}, "turns", "ttft_p90"}; None
        before two samples. A role whose slots are not configured has none."""
        if len(self._samples) < 2:
            return None
        first, last = self._samples[0], self._samples[-1]
        out: dict[str, Any] = {"seconds": round(last[0] - first[0], 1)}
        for role in ROLES:
            values = [s[1][role] for s in self._samples if not math.isnan(s[1][role])]
            if values:
                finite = [v for v in values if not math.isinf(v)]
                peak = max(values)
                mean = sum(finite) / len(finite) if finite else peak
                demand = [s[2][role] for s in self._samples if not math.isnan(s[2][role])]
                out[role] = {
                    "demand": round(sum(demand) / len(demand), 3) if demand else None,
                    "saturation": _round(mean),
                    "peak": _round(peak),
                }
        delta = _delta(first[3], last[3])
        out["turns"] = int(delta[-1][1]) if delta else 0
        p90 = quantile(0.9, delta)
        out["ttft_p90"] = None if p90 is None else round(p90, 3)
        return out


def _round(value: float) -> float | str:
    return "Inf" if math.isinf(value) else round(value, 3)


def _delta(before: list[tuple[float, float]], after: list[tuple[float, float]]) -> list[tuple[float, float]]:
    earlier: Mapping[float, float] = dict(before)
    return [(bound, count - earlier.get(bound, 0.0)) for bound, count in after]


def histogram_buckets(families: Any, name: str) -> list[tuple[float, float]]:
    """Cumulative bucket counts of histogram `name`, summed over its label sets, from a registry's collect()."""
    sums: dict[float, float] = {}
    for family in families:
        if family.name != name:
            continue
        for sample in family.samples:
            if sample.name == name + "_bucket":
                bound = float(sample.labels["le"])
                sums[bound] = sums.get(bound, 0.0) + sample.value
    return sorted(sums.items())

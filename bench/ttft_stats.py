"""The TTFT benchmark's statistics: pure functions over the per-request samples (dicts), no engine.

A sample is one measured turn: {"topology", "contender", "round", "conv", "turn", "prompt_tokens", "ttft_s",
"prefill_leg_s", "external_tokens", "local_tokens", ...}. Percentiles are linear between closest ranks (numpy's
default), so p99 of a handful of samples is close to their maximum.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

RECOMPUTE, DUPLEX, ORACLE = "recompute", "duplex", "oracle"
CONTENDERS = (RECOMPUTE, DUPLEX, ORACLE)
# History-length buckets (prompt tokens): [low, high).
BUCKETS: tuple[tuple[int, int], ...] = ((0, 1000), (1000, 2000), (2000, 4000), (4000, 1 << 30))


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), linear between closest ranks; nan for no values."""
    if not values:
        return math.nan
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def median(values: Sequence[float]) -> float:
    return percentile(values, 50)


def bucket_label(bucket: tuple[int, int]) -> str:
    lo, hi = bucket
    return f">= {lo / 1000:g}k" if hi >= 1 << 30 else f"{lo / 1000:g}k-{hi / 1000:g}k"


def bucket_of(tokens: int) -> tuple[int, int]:
    for b in BUCKETS:
        if b[0] <= tokens < b[1]:
            return b
    raise ValueError(tokens)


def rotation(items: Sequence[str], shift: int) -> list[str]:
    """`items` started at position `shift` (mod len): the order contenders run in, turn by turn and round by round."""
    k = shift % len(items)
    return [*items[k:], *items[:k]]


def _group(samples: Iterable[dict[str, Any]], *keys: str) -> dict[tuple[Any, ...], list[dict[str, Any]]]:
    out: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for s in samples:
        out.setdefault(tuple(s[k] for k in keys), []).append(s)
    return out


def summary(samples: list[dict[str, Any]]) -> dict[str, float]:
    ttft = [s["ttft_s"] for s in samples]
    return {
        "n": len(samples),
        "prompt_tokens": median([s["prompt_tokens"] for s in samples]),
        "ttft_p50_s": median(ttft),
        "ttft_p99_s": percentile(ttft, 99),
        "prefill_leg_p50_s": median([s["prefill_leg_s"] for s in samples]),
        "external_tokens": median([s["external_tokens"] for s in samples]),
        "local_tokens": median([s["local_tokens"] for s in samples]),
    }


def ratios(cells: dict[str, dict[str, float]]) -> dict[str, float]:
    """For one row (a turn or a bucket) of per-contender summaries: how many times faster duplex is than recompute
    (recompute p50 / duplex p50), and how much slower than the oracle (duplex p50 / oracle p50 - 1)."""
    get = lambda c: cells.get(c, {}).get("ttft_p50_s", math.nan)  # noqa: E731
    rc, dx, orc = get(RECOMPUTE), get(DUPLEX), get(ORACLE)
    return {
        "speedup_vs_recompute": rc / dx if dx > 0 else math.nan,
        "over_oracle": dx / orc - 1 if orc > 0 else math.nan,
        "oracle_speedup_vs_recompute": rc / orc if orc > 0 else math.nan,
    }


def table(samples: list[dict[str, Any]], by: str) -> list[dict[str, Any]]:
    """Rows per topology and `by` ("turn" or "bucket"), each with every contender's summary and the ratios."""
    rows = []
    keyed = [{**s, "bucket": bucket_of(s["prompt_tokens"])} for s in samples]
    for (topology, key), group in sorted(_group(keyed, "topology", by).items()):
        cells = {c: summary(g) for (c,), g in _group(group, "contender").items()}
        label = bucket_label(key) if by == "bucket" else key
        rows.append({"topology": topology, by: label, "cells": cells, **ratios(cells)})
    return rows


def targets(bucket_rows: list[dict[str, Any]], within: float = 0.10, speedup: float = 1.6) -> list[dict[str, Any]]:
    """The issue's targets per topology, on the history buckets of 2k tokens and more: duplex within `within` of the
    oracle in each, and at least `speedup` over recompute in the longest."""
    out = []
    for topology in sorted({r["topology"] for r in bucket_rows}):
        rows = [r for r in bucket_rows if r["topology"] == topology and _low(r["bucket"]) >= 2000]
        if not rows:
            continue
        worst = max(rows, key=lambda r: r["over_oracle"])
        out.append(
            {
                "topology": topology,
                "target": f"duplex TTFT p50 within {within:.0%} of the oracle, histories >= 2k tokens",
                "value": ", ".join(f"{r['bucket']}: {r['over_oracle']:+.1%}" for r in rows),
                "pass": all(r["over_oracle"] <= within for r in rows),
                "worst": worst["over_oracle"],
            }
        )
        longest = rows[-1]
        out.append(
            {
                "topology": topology,
                "target": f"duplex >= {speedup}x faster than recompute at the longest histories",
                "value": f"{longest['bucket']}: {longest['speedup_vs_recompute']:.2f}x",
                "pass": longest["speedup_vs_recompute"] >= speedup,
            }
        )
    return out


def _low(label: str) -> float:
    head = label.removeprefix(">= ").split("-")[0]
    return float(head.removesuffix("k")) * 1000


def break_even_tokens(
    prefill_s_per_token: float, bytes_per_token: float, bandwidth: float, read_latency_s: float
) -> float:
    """Remote tokens at which reading them costs what recomputing them does: a read of n tokens takes
    read_latency + n * bytes_per_token / bandwidth, recomputing them n * prefill_s_per_token; reads win above
    n* = read_latency / (prefill_s_per_token - bytes_per_token / bandwidth), and never when the transfer per token
    is the slower (inf)."""
    margin = prefill_s_per_token - bytes_per_token / bandwidth
    return read_latency_s / margin if margin > 0 else math.inf


def fit_line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least-squares y = a + b x; (intercept, slope). Two distinct xs at least."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        raise ValueError("fit_line needs two distinct x values")
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    return my - b * mx, b

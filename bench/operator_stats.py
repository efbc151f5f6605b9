"""The operator benchmark's numbers: pure functions over the timings one size recorded and the audit events of the
operator's identity (no cluster; bench/operator_bench.py collects them)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ttft_stats import percentile

WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})

# The targets, at the largest size (200 servings).
TARGET_ALL_READY_S = 60.0
TARGET_CHILDREN_P99_S = 1.0
TARGET_IDLE_WRITES = 0
TARGET_RSS_MIB = 200.0


def latencies(start: Mapping[str, float], end: Mapping[str, float]) -> dict[str, float]:
    """Per object, `end` minus `start` (seconds), for the objects that have both."""
    return {name: end[name] - t for name, t in start.items() if name in end}


def spread(values: Iterable[float]) -> dict[str, float]:
    xs = list(values)
    return {"n": len(xs), "p50": percentile(xs, 50), "p99": percentile(xs, 99), "max": max(xs, default=math.nan)}


def _resource(ev: Mapping[str, Any]) -> str | None:
    ref = ev.get("objectRef") or {}
    if not ref.get("resource"):
        return None
    return str(ref["resource"]) + (f"/{ref['subresource']}" if ref.get("subresource") else "")


def is_resumed_watch(ev: Mapping[str, Any]) -> bool:
    """kopf reopening a watch stream that timed out, from the resourceVersion it last saw: the one request an idle
    operator is expected to make (each stream lasts a few minutes)."""
    return ev.get("verb") == "watch" and "resourceVersion=" in str(ev.get("requestURI", ""))


def classify(requests: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The operator's requests in a window: how many, how many writes, how many resumed watches, by verb and
    resource (`verb resource`, most common first)."""
    writes = [ev for ev in requests if ev.get("verb") in WRITE_VERBS]
    resumed = [ev for ev in requests if is_resumed_watch(ev)]
    by = Counter(f"{ev.get('verb')} {_resource(ev) or ev.get('requestURI', '?')}" for ev in requests)
    return {
        "requests": len(requests),
        "writes": len(writes),
        "resumed_watches": len(resumed),
        "other": len(requests) - len(resumed),
        "by_verb_resource": dict(by.most_common()),
    }


def idle_summary(
    requests: Sequence[Mapping[str, Any]], window_s: float, resync_s: float, passes: float, servings: int
) -> dict[str, Any]:
    """The idle window: requests per resync period (one resync pass over every serving), with and without kopf's
    resumed watches, and how many passes the operator's own counter saw against what the resync period implies."""
    counts = classify(requests)
    periods = window_s / resync_s
    return {
        **counts,
        "window_s": window_s,
        "resync_s": resync_s,
        "resync_periods": periods,
        "requests_per_resync": counts["requests"] / periods if periods else math.nan,
        "other_per_resync": counts["other"] / periods if periods else math.nan,
        "passes": passes,
        "passes_expected": servings * periods,
    }


def growth(sizes: Sequence[int], values: Sequence[float]) -> dict[str, float]:
    """How a metric grows from the smallest to the largest size: the ratio of its values, and the exponent k in
    value ~ size^k (1: linear, 0: flat); nan where a value is missing or not positive."""
    if len(sizes) < 2 or not values[0] or not values[-1] or values[0] <= 0 or values[-1] <= 0:
        return {"ratio": math.nan, "exponent": math.nan}
    if any(map(math.isnan, (values[0], values[-1]))):
        return {"ratio": math.nan, "exponent": math.nan}
    ratio = values[-1] / values[0]
    return {"ratio": ratio, "exponent": math.log(ratio) / math.log(sizes[-1] / sizes[0])}


def verdicts(largest: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Each target against the largest size's figures: (target, measured, met)."""
    ready = largest.get("all_ready_s")
    p99 = largest["children_s"]["p99"]
    single = largest["single_children_s"]["p99"]
    writes = largest["idle"]["writes"]
    rss = largest["rss_mib"]["peak"]
    complete = largest["ready"] == largest["servings"]
    return [
        {
            "target": f"all {largest['servings']} servings Ready in under {TARGET_ALL_READY_S:.0f} s",
            "measured": f"{ready:.1f} s" if complete and ready is not None else f"{largest['ready']} Ready",
            "met": bool(complete and ready is not None and ready < TARGET_ALL_READY_S),
        },
        {
            "target": f"apply-to-children p99 under {TARGET_CHILDREN_P99_S:.0f} s, all {largest['servings']} "
            "created at once",
            "measured": f"{p99:.2f} s",
            "met": bool(p99 < TARGET_CHILDREN_P99_S),
        },
        {
            "target": f"apply-to-children p99 under {TARGET_CHILDREN_P99_S:.0f} s, one serving at a time beside "
            f"{largest['servings']}",
            "measured": f"{single:.2f} s",
            "met": bool(single < TARGET_CHILDREN_P99_S),
        },
        {
            "target": f"zero writes over {largest['idle']['window_s']:.0f} idle seconds",
            "measured": f"{writes} writes",
            "met": writes == TARGET_IDLE_WRITES,
        },
        {
            "target": f"operator RSS under {TARGET_RSS_MIB:.0f} MiB at {largest['servings']} servings",
            "measured": f"{rss:.0f} MiB (peak)",
            "met": bool(rss < TARGET_RSS_MIB),
        },
    ]

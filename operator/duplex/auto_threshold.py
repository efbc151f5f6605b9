"""kvTransfer.recomputeThreshold: Auto, as a pure function of the routers' measurements and the last status:

    decide(spec, last effectiveKV, fabric reports, now) -> the router's threshold, and status.effectiveKV's why

Each router fits what a computed and a read token cost from its own prefill legs (router/calibration.py) and
publishes the fit in its fabric report. The operator takes the median break-even of the fresh fits, within
[minTokens, maxTokens] (maxTokens when reading never pays), and moves the threshold to it only when it is off by
more than `margin`, and not twice within `minIntervalSeconds`. The router applies the threshold on a config reload:
a change restarts nothing. The engines keep minTokens as their kv_recompute_threshold, below anything the router
lets through.
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import median
from typing import Any

from duplex.api.spec import DisaggregatedServingSpec, RecomputeCalibrationSpec
from duplex.api.status import EffectiveKV, RecomputeCalibration
from duplex.children.kv_config import is_auto
from duplex.status import fresh_reports, parse_time

_INPUTS = ("compute_seconds_per_token", "read_seconds_per_token", "replay_overhead_seconds")


@dataclass(frozen=True)
class Decision:
    value: int  # the threshold the router applies from now on
    calibration: RecomputeCalibration  # why, for status


def decide(
    spec: DisaggregatedServingSpec, last: EffectiveKV | None, reports: dict[str, str], at: str
) -> Decision | None:
    """None unless the spec says Auto."""
    if not is_auto(spec):
        return None
    cal = spec.kv_transfer.recompute_calibration
    before = last.recompute_calibration if last is not None else None
    if before is None or last is None or last.recompute_threshold is None:
        current, changed_at = _bounded(cal, cal.initial), None
    else:
        current, changed_at = _bounded(cal, last.recompute_threshold), before.changed_at
    fits = _fits(reports, at, cal)
    if not fits:
        reason = "Initial" if changed_at is None else "NotMeasured"
        message = f"no router has measured {cal.min_samples} prefill legs of each kind with varying sizes yet"
        return Decision(current, RecomputeCalibration(reason=reason, message=message, changed_at=changed_at))
    target = round(median(_bounded(cal, f["threshold"]) for f in fits))
    inputs = {name: median(float(f[name]) for f in fits) for name in _INPUTS}
    seen = RecomputeCalibration(
        reason="Measured",
        measured_threshold=target,
        samples=sum(int(f.get("recomputes", 0)) + int(f.get("replays", 0)) for f in fits),
        routers=len(fits),
        changed_at=changed_at,
        **inputs,
    )
    if abs(target - current) <= cal.margin * max(current, 1):
        seen.reason, seen.message = "WithinMargin", f"measured {target} tokens, within {cal.margin:.0%} of {current}"
        return Decision(current, seen)
    if changed_at is not None:
        waited = (parse_time(at) - parse_time(changed_at)).total_seconds()
        if waited < cal.min_interval_seconds:
            left = int(cal.min_interval_seconds - waited)
            seen.reason, seen.message = "Waiting", f"measured {target} tokens; {current} stays for {left} s more"
            return Decision(current, seen)
    seen.changed_at = at
    seen.message = f"{current} -> {target} tokens: {_explain(inputs, target)}"
    return Decision(target, seen)


def _bounded(cal: RecomputeCalibrationSpec, threshold: Any) -> int:
    if not isinstance(threshold, int) or isinstance(threshold, bool):
        return cal.max_tokens  # the fit says reading never pays
    return min(max(threshold, cal.min_tokens), cal.max_tokens)


def _fits(reports: dict[str, str], at: str, cal: RecomputeCalibrationSpec) -> list[dict[str, Any]]:
    """The fresh routers' fits that carry every input and enough samples of each kind."""
    out = []
    for _, report in fresh_reports(reports, at):
        fit = report.get("calibration")
        if not isinstance(fit, dict) or not all(isinstance(fit.get(n), int | float) for n in _INPUTS):
            continue
        if min(fit.get("recomputes", 0), fit.get("replays", 0)) >= cal.min_samples:
            out.append(fit)
    return out


def _explain(inputs: dict[str, float], target: int) -> str:
    compute, read, overhead = (inputs[n] for n in _INPUTS)
    return (
        f"a token costs {compute * 1e3:.3g} ms computed and {read * 1e3:.3g} ms read, a read {overhead * 1e3:.3g} ms "
        f"more; reading pays from {target} tokens"
    )

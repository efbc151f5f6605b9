"""The planner of roles in scaling.mode Automatic: their replicas from what the routers measured over the last minute
(router/load.py, carried in their fabric reports). Pure: the pass's inputs and the previous decision in, the
decision out, with its inputs for status.

Each role is sized so that its saturation (legs in flight over what its engines run at once) would meet
spec.autoscaling.targetSaturation: ceil(demand / target), where demand is the legs in flight in engines' worth, summed
over routers (each counts its own legs). Demand does not depend on how many pods measured it, so a report taken before a
scale-up does not scale again once the pods are there. While the time to first token misses its objective, prefill gets
one pod more, once per minute measured wholly after its last scale-up (a TTFT from before it says nothing of the pods it
added) and of at least TTFT_MIN_TURNS turns. The prefill-per-decode bounds raise the smaller role. Up at once; down only
after the recommendation has stayed below the size for scaleDownSeconds, and then to the highest recommendation of that
window. The last decision lives in status, so an operator restart carries on where it was.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from duplex.api.spec import AutoscalingSpec, ScalingSpec
from duplex.api.status import Autoscaling, RolePlan
from duplex.render import Serving

ROLES = ("prefill", "decode")
LOAD_MAX_AGE_SECONDS = 90.0  # a router's load older than this says nothing about now (it writes every 15 s)
TTFT_MIN_TURNS = 20  # a p90 of fewer turns is noise (two turns on a cold serving once added two prefill pods)


@dataclass(frozen=True)
class Plan:
    status: Autoscaling
    replicas: dict[str, int]  # what to apply for each Automatic role (in dry run: what is live)
    changes: list[tuple[str, int, int]]  # (role, from, to) this pass scales, or would in dry run


def automatic(serving: Serving) -> list[str]:
    return [r for r in ROLES if _scaling(serving, r).mode == "Automatic"]


def plan(
    serving: Serving,
    live: Mapping[str, Mapping[str, Any] | None],
    reports: Sequence[tuple[str, Mapping[str, Any]]],
    previous: Autoscaling | None,
    at: str,
) -> Plan | None:
    """None when no role is Automatic."""
    roles = automatic(serving)
    if not roles:
        return None
    auto = serving.spec.autoscaling
    loads, fresh = [], []
    prefill_up = getattr(getattr(previous, "prefill", None), "scaled_up_at", None)
    for _, report in reports:
        age = _age(report.get("at"), at)
        if isinstance(report.get("load"), dict) and age is not None and age <= LOAD_MAX_AGE_SECONDS:
            loads.append(report["load"])
            if _measured_after(report, prefill_up) and (report["load"].get("turns") or 0) >= TTFT_MIN_TURNS:
                fresh.append(report["load"])
    ttft = _worst_ttft(loads)
    current = {r: _current(serving, r, live.get(r)) for r in ROLES}
    saturation = {r: _summed(loads, r, "saturation") for r in ROLES}
    demand = {r: _summed(loads, r, "demand") for r in ROLES}
    recommended = {r: _recommend(auto, _scaling(serving, r), current[r], demand[r]) for r in roles}
    slow = _worst_ttft(fresh)
    if "prefill" in roles and auto.ttft_p90_seconds is not None and slow is not None and slow > auto.ttft_p90_seconds:
        scaling = _scaling(serving, "prefill")
        recommended["prefill"] = scaling.bound(max(recommended["prefill"], current["prefill"] + 1))
    _bound_ratio(serving, recommended, current)
    plans: dict[str, RolePlan] = {}
    for role in roles:
        before = getattr(previous, role, None) if previous is not None else None
        measured = (demand[role], saturation[role])
        plans[role] = _stabilize(auto, current[role], recommended[role], measured, before, at)
    changes = [(r, current[r], p.replicas) for r, p in plans.items() if p.replicas != current[r]]
    status = Autoscaling(
        at=at,
        dry_run=auto.dry_run,
        ttft_p90_seconds=ttft,
        routers=len(loads),
        **{role: p for role, p in plans.items()},
    )
    if previous is not None and _same(previous, status):
        status = status.model_copy(update={"at": previous.at})  # nothing new: status is not rewritten
    replicas = {r: current[r] if auto.dry_run else p.replicas for r, p in plans.items()}
    return Plan(status, replicas, changes)


def _worst_ttft(loads: Sequence[Mapping[str, Any]]) -> float | None:
    ttfts = [float(t) for load in loads if isinstance(t := load.get("ttft_p90"), (int, float))]
    return max(ttfts) if ttfts else None


def _measured_after(report: Mapping[str, Any], stamp: str | None) -> bool:
    """Whether the report's window (its last `seconds` before `at`) began after `stamp` (None: always)."""
    if stamp is None:
        return True
    age = _age(stamp, str(report.get("at")))
    seconds = (report.get("load") or {}).get("seconds")
    if age is None or not isinstance(seconds, (int, float)):
        return False
    return age > seconds


def _scaling(serving: Serving, role: str) -> ScalingSpec:
    scaling: ScalingSpec = getattr(serving.spec, role).scaling
    return scaling


def _current(serving: Serving, role: str, live: Mapping[str, Any] | None) -> int:
    replicas = ((live or {}).get("spec") or {}).get("replicas")
    if isinstance(replicas, int):
        return replicas
    return int(getattr(serving.spec, role).starting_replicas())


def _summed(loads: Sequence[Mapping[str, Any]], role: str, name: str) -> float | None:
    values = []
    for load in loads:
        value = (load.get(role) or {}).get(name)
        if value == "Inf":
            value = math.inf
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            values.append(float(value))
    return sum(values) if values else None


def _recommend(auto: AutoscalingSpec, scaling: ScalingSpec, current: int, demand: float | None) -> int:
    wanted = current if demand is None else math.ceil(demand / auto.target_saturation - 1e-9)
    return scaling.bound(wanted)


def _bound_ratio(serving: Serving, recommended: dict[str, int], current: Mapping[str, int]) -> None:
    """Raise the smaller role into the prefill-per-decode bounds (only a role the planner sizes is changed)."""
    ratio = serving.spec.autoscaling.prefill_per_decode
    prefill = recommended.get("prefill", current["prefill"])
    decode = recommended.get("decode", current["decode"])
    if ratio.min is not None and "prefill" in recommended and prefill < ratio.min * decode:
        recommended["prefill"] = _scaling(serving, "prefill").bound(math.ceil(ratio.min * decode - 1e-9))
    if ratio.max is not None and "decode" in recommended and prefill > ratio.max * decode:
        recommended["decode"] = _scaling(serving, "decode").bound(math.ceil(prefill / ratio.max - 1e-9))


def _stabilize(
    auto: AutoscalingSpec,
    current: int,
    recommended: int,
    measured: tuple[float | None, float | None],
    before: RolePlan | None,
    at: str,
) -> RolePlan:
    demand, saturation = measured
    sat = None if saturation is None or math.isinf(saturation) else round(saturation, 3)
    up = at if recommended > current and demand is not None else before.scaled_up_at if before is not None else None
    common = {"recommended": recommended, "saturation": sat, "demand": demand, "scaled_up_at": up}
    if demand is None:
        return RolePlan(replicas=current, reason="NoMeasurements", **common)
    if recommended >= current:
        reason = "ScaleUp" if recommended > current else "Hold"
        return RolePlan(replicas=recommended, reason=reason, **common)
    since = before.lower_since if before is not None and before.lower_since else at
    peak = (
        max(before.lower_peak or recommended, recommended) if before is not None and before.lower_since else recommended
    )
    if (_age(since, at) or 0.0) >= auto.scale_down_seconds:
        return RolePlan(replicas=min(peak, current), reason="ScaleDown", **common)
    return RolePlan(replicas=current, reason="Waiting", lower_since=since, lower_peak=peak, **common)


def _same(a: Autoscaling, b: Autoscaling) -> bool:
    return a.model_dump(exclude={"at"}) == b.model_dump(exclude={"at"})


def _age(stamp: Any, at: str) -> float | None:
    try:
        then = datetime.datetime.fromisoformat(str(stamp).replace("Z", "+00:00"))
        now = datetime.datetime.fromisoformat(at.replace("Z", "+00:00"))
    except ValueError:
        return None
    return (now - then).total_seconds()


def message(changes: Sequence[tuple[str, int, int]], status: Autoscaling) -> str:
    parts = []
    for role, before, after in changes:
        plan_ = getattr(status, role)
        sat = f"demand {plan_.demand} engines, saturation {plan_.saturation}"
        parts.append(f"{role} {before} -> {after} ({plan_.reason}: {sat})")
    ttft = f"; TTFT p90 {status.ttft_p90_seconds:.2f} s" if status.ttft_p90_seconds is not None else ""
    prefix = "would scale (dry run): " if status.dry_run else ""
    return prefix + ", ".join(parts) + ttft + f"; from {status.routers} router(s)"

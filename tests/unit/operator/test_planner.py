"""The planner of roles in scaling.mode Automatic (duplex.planner): each role sized to the target saturation from the
routers' load, prefill grown while TTFT misses its objective, the prefill-per-decode bounds, up at once and down
only after a stable window, a dry run that scales nothing, and each decision in status with an Event."""

from __future__ import annotations

import copy
import json
from typing import Any

from sync_helpers import READY, T1, edit, observed, parent

from duplex import status
from duplex.api.status import Autoscaling, DisaggregatedServingStatus
from duplex.planner import plan
from duplex.render import parse
from duplex.sync import sync

AUTO = {"maxNumSeqs": 8, "scaling": {"mode": "Automatic", "minReplicas": 1, "maxReplicas": 10}}
T2, T3 = "2026-01-01T00:06:00Z", "2026-01-01T00:11:00Z"


def serving(patch: dict[str, Any] | None = None) -> Any:
    return parse(parent({"prefill": copy.deepcopy(AUTO), "decode": copy.deepcopy(AUTO), **(patch or {})}))


def live(prefill: int, decode: int) -> dict[str, Any]:
    return {"prefill": {"spec": {"replicas": prefill}}, "decode": {"spec": {"replicas": decode}}}


def report(at: str = T1, ttft: float | None = None, **demand: float) -> tuple[str, dict[str, Any]]:
    """A router's load: each role's demand (legs in flight in engines' worth; saturation beside it for status)."""
    load = {role: {"demand": value, "saturation": value / 2, "peak": value} for role, value in demand.items()}
    return ("router-0", {"at": at, "load": {**load, "seconds": 60, "turns": 40, "ttft_p90": ttft}})


def test_no_automatic_role_no_plan() -> None:
    assert plan(parse(parent()), live(1, 1), [report(prefill=3.0)], None, T1) is None


def test_each_role_is_sized_to_the_target_saturation_from_its_demand_summed_over_routers() -> None:
    two_routers = [report(prefill=0.6, decode=1.5), ("router-1", report(prefill=0.6, decode=1.5)[1])]
    decision = plan(serving(), live(2, 2), two_routers, None, T1)
    assert decision is not None
    # decode: 3 engines' worth of legs / 0.75 = 4; prefill: 1.2 / 0.75 = 1.6 -> 2
    assert decision.replicas == {"prefill": 2, "decode": 4}
    assert decision.status.decode is not None and decision.status.decode.reason == "ScaleUp"
    assert decision.status.decode.demand == 3.0 and decision.status.decode.saturation == 1.5
    assert decision.status.prefill is not None and decision.status.prefill.reason == "Hold"
    assert decision.changes == [("decode", 2, 4)] and decision.status.routers == 2


def test_a_report_from_before_a_scale_up_does_not_scale_again() -> None:
    first = plan(serving(), live(1, 1), [report(decode=1.5)], None, T1)
    assert first.replicas["decode"] == 2
    again = plan(serving(), live(1, 2), [report(decode=1.5)], first.status, T1)  # the same report, 2 pods now
    assert again.replicas["decode"] == 2 and again.status.decode.reason == "Hold"


def test_bounds_unknown_demand_and_stale_reports() -> None:
    assert plan(serving(), live(2, 2), [report(decode=20.0)], None, T1).replicas["decode"] == 10  # maxReplicas
    assert plan(serving(), live(2, 2), [report(decode=0.0)], None, T2).status.decode.recommended == 1  # minReplicas
    unknown = plan(serving(), live(2, 3), [report()], None, T1)
    assert unknown.replicas == {"prefill": 2, "decode": 3} and unknown.status.decode.reason == "NoMeasurements"
    stale = plan(serving(), live(2, 3), [report(at="2026-01-01T00:00:00Z", decode=5.0)], None, T1)
    assert stale.replicas["decode"] == 3 and stale.status.routers == 0
    first = plan(serving(), {"prefill": None, "decode": None}, [], None, T1)  # nothing yet: the spec's start
    assert first.replicas == {"prefill": 1, "decode": 1}


def test_prefill_grows_while_ttft_misses_its_objective() -> None:
    slow = serving({"autoscaling": {"ttftP90Seconds": 2.0}})
    assert plan(slow, live(2, 2), [report(ttft=3.5, prefill=0.4, decode=1.5)], None, T1).replicas["prefill"] == 3
    few = report(ttft=3.5, prefill=0.4, decode=1.5)
    few[1]["load"]["turns"] = 2  # a p90 of two turns says nothing
    assert plan(slow, live(2, 2), [few], None, T1).replicas["prefill"] == 2
    met = plan(slow, live(2, 2), [report(ttft=1.5, prefill=0.4, decode=1.5)], None, T1)
    assert met.status.prefill.recommended == 1 and met.status.prefill.reason == "Waiting"  # down only later


def test_a_slow_minute_adds_one_prefill_pod_and_another_only_once_measured_after_it() -> None:
    """A TTFT measured before the last scale-up says nothing of the pods it added: the operator's own write of the
    Deployment (another pass, the same report) and the next report, whose minute began before the scale-up, add none."""
    slow = serving({"autoscaling": {"ttftP90Seconds": 2.0}})
    at = "2026-01-01T00:05:{:02d}Z".format
    first = plan(slow, live(1, 1), [report(at=at(0), ttft=3.5, prefill=0.4, decode=0.4)], None, at(1))
    assert first.replicas["prefill"] == 2 and first.status.prefill.scaled_up_at == at(1)
    again = plan(slow, live(2, 1), [report(at=at(0), ttft=3.5, prefill=0.4, decode=0.4)], first.status, at(2))
    assert again.replicas["prefill"] == 2
    later = plan(slow, live(2, 1), [report(at=at(45), ttft=3.5, prefill=0.4, decode=0.4)], again.status, at(46))
    assert later.replicas["prefill"] == 2 and later.status.prefill.scaled_up_at == at(1)
    after = plan(slow, live(2, 1), [report(at="2026-01-01T00:06:05Z", ttft=3.5, prefill=0.4)], later.status, T2)
    assert after.replicas["prefill"] == 3  # its minute began after the scale-up, and still missed


def test_the_prefill_per_decode_bounds_raise_the_smaller_role() -> None:
    bounded = serving({"autoscaling": {"prefillPerDecode": {"min": 0.5, "max": 1.0}}})
    decision = plan(bounded, live(1, 1), [report(prefill=0.1, decode=3.0)], None, T1)
    assert decision.replicas == {"prefill": 2, "decode": 4}  # decode 4 needs at least 2 prefill
    decision = plan(bounded, live(1, 1), [report(prefill=3.0, decode=0.1)], None, T1)
    assert decision.replicas == {"prefill": 4, "decode": 4}  # at most one prefill per decode


def test_down_only_after_the_window_and_to_its_highest_recommendation() -> None:
    s = serving()
    first = plan(s, live(4, 4), [report(decode=1.2)], None, T1)  # 1.2 / 0.75 = 1.6 -> 2
    assert first.replicas["decode"] == 4 and first.status.decode.reason == "Waiting"
    assert first.status.decode.lower_since == T1 and first.status.decode.lower_peak == 2
    second = plan(s, live(4, 4), [report(at=T2, decode=2.0)], first.status, T2)  # recommends 3
    assert second.replicas["decode"] == 4 and second.status.decode.lower_peak == 3
    third = plan(s, live(4, 4), [report(at=T3, decode=0.3)], second.status, T3)  # the window has passed
    assert third.replicas["decode"] == 3 and third.status.decode.reason == "ScaleDown"
    back_up = plan(s, live(4, 4), [report(at=T2, decode=3.0)], first.status, T2)  # a Hold resets the window
    assert back_up.status.decode.reason == "Hold" and back_up.status.decode.lower_since is None
    # ... and the status write removes the window (a merge patch keeps what it leaves out)
    written = status.patch_body(DisaggregatedServingStatus(autoscaling=back_up.status))["autoscaling"]["decode"]
    assert written["lowerSince"] is None and written["lowerPeak"] is None


def test_an_unchanged_decision_keeps_its_time_so_status_is_not_rewritten() -> None:
    first = plan(serving(), live(2, 2), [report(decode=1.5)], None, T1)
    again = plan(serving(), live(2, 2), [report(at=T2, decode=1.5)], first.status, T2)
    assert again.status.at == T1


def with_load(objs: list[dict[str, Any]], load_report: tuple[str, dict[str, Any]]) -> list[dict[str, Any]]:
    def put(cm: dict[str, Any]) -> None:
        cm["data"] = {load_report[0]: json.dumps(load_report[1])}

    return edit(objs, "ConfigMap/demo-fabric", put)


def test_sync_scales_the_deployment_says_why_and_a_dry_run_scales_nothing() -> None:
    automatic = parent({"decode": copy.deepcopy(AUTO)})
    children = with_load(observed(automatic), report(at=T1, decode=1.5))
    result = sync(automatic, children, READY, at=T1)
    (deploy,) = [o for o in result.apply if o["metadata"]["name"] == "demo-decode"]
    assert deploy["spec"]["replicas"] == 2
    (event,) = [e for e in result.events if e.reason == "Autoscaled"]
    assert event.message.startswith("decode 1 -> 2 (ScaleUp: demand 1.5 engines, saturation 0.75)")
    assert result.status.autoscaling is not None and result.status.autoscaling.decode.replicas == 2

    dry = parent({"decode": copy.deepcopy(AUTO), "autoscaling": {"dryRun": True}})
    children = with_load(observed(dry), report(at=T1, decode=1.5))
    result = sync(dry, children, READY, at=T1)
    assert not [o for o in result.apply if o["metadata"]["name"] == "demo-decode"]
    (event,) = [e for e in result.events if e.reason == "AutoscaleDryRun"]
    assert "would scale (dry run): decode 1 -> 2" in event.message
    status = result.status.autoscaling
    assert isinstance(status, Autoscaling) and status.dry_run and status.decode.replicas == 2
    previous = {**READY, "autoscaling": status.model_dump(by_alias=True, exclude_none=True)}
    again = sync(dry, children, previous, at=T2)
    assert not [e for e in again.events if e.reason == "AutoscaleDryRun"]  # said once, not every pass

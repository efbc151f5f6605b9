"""Pure status aggregation: observed workloads (Deployments, LeaderWorkerSets: workloads.py) + the spec -> the
parent's typed status and conditions."""

from __future__ import annotations

import datetime
import json
from collections.abc import Iterable, Mapping
from typing import Any, Literal
from urllib.parse import urlsplit

from duplex import replicas, workloads
from duplex.api.status import Condition, DisaggregatedServingStatus, RecomputeCalibration, RoleStatus
from duplex.children.engine import engine_config_hash
from duplex.children.kv_config import effective
from duplex.children.labels import ROLE_LABEL, SERVING_LABEL, child_name
from duplex.children.services import router_endpoint
from duplex.config_warnings import config_warnings
from duplex.fabric import fabric_ready
from duplex.render import Serving

WORKLOADS = workloads.WORKLOADS
ROLE_CONDITIONS = {"prefill": "PrefillReady", "decode": "DecodeReady", "router": "RouterReady"}
ConditionStatus = Literal["True", "False", "Unknown"]


# A router writes its fabric report every heartbeat (router config fabric.report.heartbeat_seconds, 120 s rendered);
# one older than five of them is from a router that is gone or cut off from the API server.
REPORT_MAX_AGE_SECONDS = 600


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(stamp: str) -> datetime.datetime:
    return datetime.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC)


def fresh_reports(reports: Mapping[str, str], at: str) -> list[tuple[str, dict[str, Any]]]:
    """The routers' reports (router pod -> JSON) written in the last REPORT_MAX_AGE_SECONDS, parsed."""
    fresh = []
    for pod, raw in sorted(reports.items()):
        try:
            report = json.loads(raw)
            if (parse_time(at) - parse_time(report["at"])).total_seconds() <= REPORT_MAX_AGE_SECONDS:
                fresh.append((pod, report))
        except (ValueError, KeyError, TypeError):
            continue  # not a report: whatever else sits in the ConfigMap is not ours to judge
    return fresh


def kv_transfer(reports: Mapping[str, str], at: str) -> tuple[ConditionStatus, str, str]:
    """KVTransferHealthy from the routers' fabric reports (router pod -> JSON, router/fabric_report.py): False if
    any fresh report is unhealthy, True if fresh reports have measured reads and all are healthy, else Unknown."""
    fresh: list[tuple[str, dict[str, Any]]] = []
    for pod, report in fresh_reports(reports, at):
        healthy, measured, message = report.get("healthy"), report.get("measured", True), report.get("message")
        if isinstance(healthy, bool):
            fresh.append((pod, {"healthy": healthy, "measured": measured is True, "message": str(message)}))
    if not fresh:
        minutes = REPORT_MAX_AGE_SECONDS // 60
        return "Unknown", "NoReports", f"no router has reported on KV transfers in the last {minutes} minutes"
    bad = [(pod, r) for pod, r in fresh if not r["healthy"]]
    if bad:
        pod, report = bad[0]
        more = f" (and {len(bad) - 1} more routers)" if len(bad) > 1 else ""
        return "False", "TransfersDegraded", f"router {pod}: {report['message']}{more}"
    measured = [(pod, r) for pod, r in fresh if r["measured"]]
    if not measured:
        return "Unknown", "NotMeasured", "no KV transfer measured yet"
    return "True", "TransfersHealthy", measured[0][1]["message"]


# The canary's failing step (router/canary.py) -> the condition's reason.
CANARY_REASONS = {
    "prefill": "PrefillComputedNothing",
    "p_to_d": "DecodeDidNotReadPrefill",
    "retained": "DecodeKeptNoBlocks",
    "d_to_p": "PrefillDidNotReadBack",
    "receipt": "ReceiptDisagrees",
}


def disaggregation_verified(
    enabled: bool, reports: Mapping[str, str], engine_ips: set[str], at: str
) -> tuple[ConditionStatus, str, str]:
    """DisaggregationVerified from the canaries in the routers' fresh reports, counting only those run on engine
    pods that exist now (`engine_ips`: a result from before a rollout says nothing of the new pods): False if
    any failed, True if one passed, else Unknown."""
    if not enabled:
        return "Unknown", "NotChecked", "router.canary.enabled is false"
    current = []
    for pod, report in fresh_reports(reports, at):
        canary = report.get("canary")
        if not isinstance(canary, dict) or not isinstance(canary.get("ok"), bool):
            continue
        hosts = {urlsplit(str(canary.get(role, ""))).hostname for role in ("prefill", "decode")}
        if hosts <= engine_ips:
            current.append((pod, canary))
    failed = [(pod, c) for pod, c in current if not c["ok"]]
    if failed:
        pod, canary = failed[0]
        reason = CANARY_REASONS.get(str(canary.get("step")), "CanaryFailed")
        where = f"prefill {canary.get('prefill')}, decode {canary.get('decode')}"
        return "False", reason, f"router {pod}, {where}: {canary.get('message', '')}"
    if not current:
        return "Unknown", "Pending", "no router has run its canary on the current engine pods yet"
    pod, canary = current[0]
    return "True", "Verified", f"router {pod}: {canary.get('message', '')}"


def engine_ips(serving: str, pods: Iterable[Mapping[str, Any]]) -> set[str]:
    """The pod IPs of the serving's engine pods that are not being deleted."""
    ips = set()
    for pod in pods:
        meta, st = pod.get("metadata") or {}, pod.get("status") or {}
        labels = meta.get("labels") or {}
        engine = labels.get(SERVING_LABEL) == serving and labels.get(ROLE_LABEL) in ("prefill", "decode")
        if engine and st.get("podIP") and not meta.get("deletionTimestamp"):
            ips.add(str(st["podIP"]))
    return ips


def role_status(desired: int, progress: workloads.Progress) -> RoleStatus:
    ready, updated = progress.ready, progress.updated
    return RoleStatus(replicas=desired, ready_replicas=ready, updated_replicas=updated, summary=f"{ready}/{desired}")


def _role_condition(workload: str, desired: int, progress: workloads.Progress) -> tuple[ConditionStatus, str, str]:
    ready, updated, unit = progress.ready, progress.updated, progress.unit
    if not progress.exists:
        return "False", "NotCreated", f"{workload} {progress.kind} does not exist yet"
    if desired == 0:
        return "False", "ScaledToZero", f"{workload} has 0 replicas"
    if progress.outdated:
        return (
            "False",
            "RollingOut",
            f"{updated}/{desired} {workload} {unit} updated, {progress.outdated} old still running",
        )
    if ready >= desired and updated >= desired:
        return "True", "AllReplicasReady", f"{ready}/{desired} {workload} {unit} ready"
    if progress.starting:
        return "False", "Starting", f"{ready}/{desired} {workload} {unit} ready, within the progress deadline"
    return "False", "ReplicasNotReady", f"{ready}/{desired} {workload} {unit} ready, {updated} updated"


def _named(ranks: list[str]) -> str:
    if not ranks:
        return ""
    more = len(ranks) - workloads.NAMED_AT_MOST
    return "; not ready: " + ", ".join(ranks[: workloads.NAMED_AT_MOST]) + (f" and {more} more" if more > 0 else "")


class _Conditions:
    """Builds conditions that keep their lastTransitionTime while their status holds (API conventions)."""

    def __init__(self, previous: DisaggregatedServingStatus | None, generation: int | None, at: str) -> None:
        self.before = {c.type: c for c in (previous.conditions if previous else [])}
        self.generation = generation
        self.at = at

    def __call__(self, ctype: str, status: ConditionStatus, reason: str, message: str) -> Condition:
        before = self.before.get(ctype)
        held = before is not None and before.status == status and before.last_transition_time is not None
        return Condition(
            type=ctype,
            status=status,
            reason=reason,
            message=message,
            observed_generation=self.generation,
            last_transition_time=before.last_transition_time if held and before else self.at,
        )


def compute(
    serving: Serving,
    observed: Mapping[str, Mapping[str, Any] | None],
    previous: DisaggregatedServingStatus | None,
    at: str | None = None,
    pods: Iterable[Mapping[str, Any]] = (),
    fabric_reports: Mapping[str, str] | None = None,
    auto_threshold: int | None = None,
    calibration: RecomputeCalibration | None = None,
) -> DisaggregatedServingStatus:
    """The parent's status; `observed` maps prefill/decode/router to its observed workload (workloads.observed; None
    when missing): a Deployment, or a LeaderWorkerSet for a role whose instances span nodes; `pods`
    are the observed engine pods (their preflight reports make FabricReady), `fabric_reports` the data of the fabric
    ConfigMap the routers write (KVTransferHealthy, and DisaggregationVerified with the pods' IPs); with
    recomputeThreshold: Auto, `auto_threshold` and `calibration` are what duplex.auto_threshold decided."""
    pods = list(pods)
    spec, gen = serving.spec, serving.generation
    at = at or now()
    condition = _Conditions(previous, gen, at)
    desired = {r: replicas.desired(serving, r, observed.get(r)) for r in replicas.ROLES}
    desired["router"] = spec.router.replicas
    deadlines = {r: getattr(spec, r).rollout.progress_deadline_seconds for r in replicas.ROLES}
    progress = {
        w: workloads.progress(workloads.kind(serving, w), observed.get(w), at, deadlines.get(w)) for w in WORKLOADS
    }
    roles = {w: role_status(desired[w], progress[w]) for w in WORKLOADS}
    role_conditions = []
    for w in WORKLOADS:
        st, reason, msg = _role_condition(w, desired[w], progress[w])
        if st != "True" and progress[w].unit == "instances":
            msg += _named(workloads.ranks_not_ready(serving.name, w, pods))
        role_conditions.append(condition(ROLE_CONDITIONS[w], st, reason, msg))
    not_ready = [c.type for c in role_conditions if c.status != "True"]
    rolling = [w for w in WORKLOADS if progress[w].updated < desired[w] or progress[w].outdated]
    conditions = [
        condition(
            "Ready",
            "False" if not_ready else "True",
            "ComponentsNotReady" if not_ready else "AllComponentsReady",
            f"not ready: {', '.join(not_ready)}" if not_ready else "prefill, decode and router are ready",
        ),
        _config_valid(condition, config_warnings(spec)),
        *role_conditions,
        condition(
            "Progressing",
            "True" if rolling else "False",
            "RollingOut" if rolling else "Stable",
            f"rolling out: {', '.join(rolling)}" if rolling else "all workloads on the current spec",
        ),
        condition("FabricReady", *fabric_ready(spec, serving.name, pods)),
        condition("KVTransferHealthy", *kv_transfer(fabric_reports or {}, at)),
        condition(
            "DisaggregationVerified",
            *disaggregation_verified(
                spec.router.canary.enabled, fabric_reports or {}, engine_ips(serving.name, pods), at
            ),
        ),
    ]
    return DisaggregatedServingStatus(
        observed_generation=gen,
        prefill=roles["prefill"],
        decode=roles["decode"],
        router=roles["router"],
        router_endpoint=router_endpoint(spec, serving.name, serving.namespace),
        effective_kv=effective(spec, auto_threshold, calibration),
        engine_config_hash=engine_config_hash(spec, serving.name, serving.namespace),
        conditions=conditions,
    )


def _config_valid(condition: _Conditions, warnings: list[str]) -> Condition:
    if warnings:
        return condition("ConfigValid", "True", "ValidWithWarnings", "; ".join(warnings))
    return condition("ConfigValid", "True", "Valid", "spec accepted")


def config_warning(status: DisaggregatedServingStatus | None) -> str | None:
    """The ConfigValid message when the spec was accepted with warnings, else None."""
    for c in status.conditions if status else []:
        if c.type == "ConfigValid" and c.reason == "ValidWithWarnings":
            return c.message
    return None


def invalid(
    generation: int | None, message: str, previous: DisaggregatedServingStatus | None, at: str | None = None
) -> DisaggregatedServingStatus:
    """Status for a spec the operator refuses: ConfigValid=False, Ready=False, children left as they were.

    Only observedGeneration and conditions are set: written as a merge patch, the last good counts stay."""
    condition = _Conditions(previous, generation, at or now())
    keep = [c for c in (previous.conditions if previous else []) if c.type not in ("ConfigValid", "Ready")]
    return DisaggregatedServingStatus(
        observed_generation=generation,
        conditions=[
            condition("Ready", "False", "ConfigInvalid", message),
            condition("ConfigValid", "False", "ConfigInvalid", message),
            *keep,
        ],
    )


def is_ready(status: DisaggregatedServingStatus | None) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in (status.conditions if status else []))


def ready_message(status: DisaggregatedServingStatus) -> str:
    return next((c.message for c in status.conditions if c.type == "Ready"), "")


def patch_body(status: DisaggregatedServingStatus) -> dict[str, Any]:
    """The status as written: a merge patch, so fields left out are kept and none is written as null, except where a
    null removes what no longer applies: in effectiveKV.recomputeCalibration (all of it without Auto) and in
    autoscaling (a role's window below its size ends: lowerSince and lowerPeak go)."""
    body = status.model_dump(by_alias=True, exclude_none=True, mode="json")
    kv = body.get("effectiveKV")
    if kv is not None and status.effective_kv is not None:
        calibration = status.effective_kv.recompute_calibration
        kv["recomputeCalibration"] = calibration.model_dump(by_alias=True, mode="json") if calibration else None
    if status.autoscaling is not None:
        body["autoscaling"] = status.autoscaling.model_dump(by_alias=True, mode="json")
    return body


def _without_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    return value


def parse_previous(status: Mapping[str, Any] | None) -> DisaggregatedServingStatus | None:
    """The status last written, or None when there is none or it no longer parses (then every time restarts)."""
    if not status:
        return None
    try:
        return DisaggregatedServingStatus.model_validate(status)
    except ValueError:
        return None


def deployment_names(serving: Serving) -> dict[str, str]:
    return {w: child_name(serving.name, w) for w in WORKLOADS}


def differs(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> bool:
    """Whether writing `new` (a patch body) changes anything (timestamps of unchanged conditions are carried over)."""
    old = _without_nulls(old or {})  # a null in `new` is what it removes
    return any(old.get(k) != _without_nulls(v) for k, v in new.items())

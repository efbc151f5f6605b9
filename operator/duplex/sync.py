"""The operator's pure core, in Metacontroller's CompositeController shape:

    sync(parent, observed children, previous status) -> children to apply, children to delete, new status, Events

plus the children to create only if missing (the engine key Secret: its random key is drawn by the shell, once).

Level-triggered: it never asks what changed or which watch event woke it; every call computes the whole desired
state from the spec, so running it twice, or after a crash halfway through applying, is safe. No I/O and no clock
(the caller passes the time). `duplex render` prints the same desired children, less the owner reference that needs
the live parent's uid: what users preview is what the cluster gets.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from duplex import auto_threshold, kv_change, lockstep, planner, replicas, revision, scale_in, workloads
from duplex import status as status_of
from duplex.api.status import DisaggregatedServingStatus, EngineChange
from duplex.children.kinds import CONFIG_MAP, DEPLOYMENT, POD, SECRET, WORKLOAD_KINDS, apply_rank, kind_of
from duplex.children.labels import ROLE_LABEL
from duplex.children.router import fabric_configmap_name
from duplex.converge import key, plan, with_owner
from duplex.policy import DEFAULT as DEFAULT_POLICY
from duplex.policy import Policy
from duplex.render import InvalidSpec, Serving, desired_children, key_secret, parse


@dataclass(frozen=True)
class Event:
    """A Kubernetes Event to post on the parent."""

    type: Literal["Normal", "Warning"]
    reason: str
    message: str


@dataclass(frozen=True)
class SyncResult:
    apply: list[dict[str, Any]] = field(default_factory=list)  # in apply order, owned by the parent
    delete: list[dict[str, Any]] = field(default_factory=list)  # observed children, in delete order
    # Pods' annotation patches, written before `apply`: on a decode scale-in, the deletion cost of each decode pod.
    annotate: list[dict[str, Any]] = field(default_factory=list)
    # Pods' status patches: the KV-revision readiness gates whose turn has come (duplex.lockstep).
    gates: list[dict[str, Any]] = field(default_factory=list)
    # `replicas` of the Deployments of External roles, handed over to another field manager (duplex.replicas).
    handover: list[replicas.Handover] = field(default_factory=list)
    # Missing children to create once and never change (the engine key Secret, without its key: the shell adds it).
    create: list[dict[str, Any]] = field(default_factory=list)
    status: DisaggregatedServingStatus = field(default_factory=DisaggregatedServingStatus)
    write_status: bool = False  # False: the status as written already says exactly this
    events: list[Event] = field(default_factory=list)
    invalid: str | None = None  # why the spec was refused (then children are left exactly as they are)

    @property
    def ready(self) -> bool:
        return status_of.is_ready(self.status)


def sync(
    parent: Mapping[str, Any],
    observed: Sequence[Mapping[str, Any]],
    previous: Mapping[str, Any] | None,
    at: str,
    policy: Policy = DEFAULT_POLICY,
) -> SyncResult:
    """One DisaggregatedServing -> what to do about it. `observed`: its children as the watch last saw them;
    `previous`: its status as last written; `at`: the time stamped on conditions that change now; `policy`: what
    the cluster's administrator lets a serving ask for beyond its CRD (duplex.policy)."""
    meta = parent["metadata"]
    last = status_of.parse_previous(previous)

    # 1. The spec, validated like admission does. A spec we refuse never half-applies: children stay untouched.
    try:
        serving = parse(dict(parent), meta["namespace"])
    except InvalidSpec as err:
        return _refused(meta.get("generation"), str(err), last, previous, at)
    denied = policy.violations(serving.spec)
    if denied:
        return _refused(meta.get("generation"), "; ".join(denied), last, previous, at)

    # 2. Desired children, owned by the parent and stamped with a hash of what they should hold; the workloads also
    # with the uid of the key Secret their pods read (a new Secret, a new key: they roll together).
    # With recomputeThreshold: Auto, the router's threshold is what the routers measured (duplex.auto_threshold).
    secret = with_owner(key_secret(serving), dict(parent))
    key_uid = _live_uid(secret, observed)
    fabric = _fabric_reports(serving, observed)
    auto = auto_threshold.decide(serving.spec, last.effective_kv if last else None, fabric, at)
    threshold = auto.value if auto else None
    # Roles in scaling.mode Automatic: replicas from the routers' load (duplex.planner). `live`: each workload as
    # observed, of the kind the spec renders it as (a Deployment, or a LeaderWorkerSet counting instances).
    live = workloads.observed(serving, observed)
    reports = status_of.fresh_reports(fabric, at)
    planned = planner.plan(serving, live, reports, last.autoscaling if last else None, at)
    sizes = planned.replicas if planned else None
    children = desired_children(serving, key_uid, threshold, sizes)
    if revision.predates(live, children, serving.spec.kv_transfer.allow_decode_tp_below_prefill):
        children = desired_children(serving, key_uid, threshold, sizes, legacy=True)
    desired = [with_owner(child, dict(parent)) for child in children]

    # 3. What must change: children missing or drifted get applied, children of ours no longer desired are deleted;
    # the key Secret is created when missing and otherwise left as it is (changing it would rotate the key). Until
    # it exists, the workloads wait: pods that start before it would read no key or the old one.
    to_apply, to_delete = _changes([*desired, secret], observed, meta["uid"])
    seen = {key(dict(o)) for o in observed}
    to_create = [o for o in to_apply if kind_of(o) is SECRET and key(o) not in seen]
    to_apply = [o for o in to_apply if kind_of(o) is not SECRET and (key_uid or kind_of(o) not in WORKLOAD_KINDS)]

    # 4. Status from the observed workloads (Deployments, or LeaderWorkerSets for roles whose instances span nodes);
    # the next pass sees what this one's writes did.
    pods = [o for o in observed if o.get("kind") == POD.kind]
    new = status_of.compute(serving, live, last, at, pods, fabric, threshold, auto.calibration if auto else None)
    change = _engine_change(serving, live, to_apply)
    # A scale-in of decode: the pods the fewest conversations are bound to go first (scale_in.py). In External mode
    # the operator cannot see a scale-in coming: the costs are kept current. A LeaderWorkerSet removes its
    # highest-numbered instances whatever their cost: their leaders' drain moves what they hold.
    live_decode = ((live.get("decode") or {}).get("spec") or {}).get("replicas")
    target = (planned.replicas if planned else {}).get("decode", serving.spec.decode.replicas)
    lowered = isinstance(live_decode, int) and target < live_decode
    by_cost = workloads.kind(serving, "decode") is DEPLOYMENT
    scaling_in = by_cost and (replicas.external(serving, "decode") or lowered)
    annotate = scale_in.deletion_costs(serving.name, scaling_in, pods, reports)
    gates = lockstep.gate_patches(serving.name, *_revision_sizes(desired, live), pods, at)
    names = status_of.deployment_names(serving)
    handover = replicas.handovers(serving, names, live, to_apply)
    if planned is not None:
        new.autoscaling = planned.status
    if change is not None:
        new.engine_change = EngineChange(
            kv=change.verdict,
            roles=list(change.roles),
            fields=list(change.fields),
            observed_generation=serving.generation,
        )
    write = status_of.differs(previous, status_of.patch_body(new))

    # 5. Events: what a roll of engine pods does to their KV, new config warnings, and whether Ready flipped. The
    # children written are the shell's to name (reconcile.py): only it knows which writes the cluster took.
    events: list[Event] = []
    if planned is not None and planned.changes and _new_decision(last, planned):
        reason = "AutoscaleDryRun" if planned.status.dry_run else "Autoscaled"
        events.append(Event("Normal", reason, planner.message(planned.changes, planned.status)))
    for role, theirs, ours in replicas.overwritten(serving, live, to_apply):
        message = (
            f"{names[role]} was scaled to {theirs} by another writer; spec.{role}.scaling.mode is Fixed, so it goes "
            f"back to {ours}. Set the mode to External to let an autoscaler own the replicas."
        )
        events.append(Event("Warning", "ReplicasOverwritten", message))
    for role, old in workloads.replaced(serving, to_delete):
        message = (
            f"{old['kind']}/{old['metadata']['name']} goes: spec.{role}.nodesPerInstance makes the role a "
            f"{workloads.kind(serving, role).kind}. Its pods stop now, so {role} serves nothing until the new "
            "instances are Ready, and each conversation recomputes once on them"
        )
        events.append(Event("Warning", "WorkloadReplaced", message))
    if change is not None:
        reason = f"EngineChangeKV{change.verdict}"
        events.append(Event("Normal" if change.verdict == "Compatible" else "Warning", reason, change.message()))
    if write:
        events += _warning_event(last, new) + _readiness_event(last, new)
    return SyncResult(
        apply=to_apply,
        delete=to_delete,
        annotate=annotate,
        gates=gates,
        handover=handover,
        create=to_create,
        status=new,
        write_status=write,
        events=events,
    )


def _revision_sizes(
    desired: Sequence[Mapping[str, Any]], live: Mapping[str, Mapping[str, Any] | None]
) -> tuple[str, dict[str, int]]:
    """The desired KV revision and each engine role's replicas (pods, or instances of a LeaderWorkerSet): the live
    workload's (an autoscaler may own them), else the desired one's."""
    rev, sizes = "", {}
    for obj in desired:
        role = ((obj.get("metadata") or {}).get("labels") or {}).get(ROLE_LABEL)
        if kind_of(dict(obj)) not in WORKLOAD_KINDS or role not in revision.ENGINE_ROLES:
            continue
        rev = revision.of_template(revision.engine_template(obj)) or ""
        size = ((live.get(role) or {}).get("spec") or {}).get("replicas", obj["spec"].get("replicas", 1))
        sizes[role] = size if isinstance(size, int) else 1
    return rev, sizes


def _new_decision(last: DisaggregatedServingStatus | None, planned: planner.Plan) -> bool:
    """Whether this pass's scaling decision was not already announced (a dry run repeats it every pass)."""
    before = last.autoscaling if last else None
    if before is None:
        return True
    return any(getattr(before, r) is None or getattr(before, r).replicas != to for r, _, to in planned.changes)


def _engine_change(
    serving: Serving, live: Mapping[str, Mapping[str, Any] | None], to_apply: list[dict[str, Any]]
) -> kv_change.EngineChange | None:
    """What applying the engine workloads of this pass does to the KV of the pods they replace (None: no engine
    pod rolls, or a first start)."""
    desired = {
        workload: template
        for obj in to_apply
        if kind_of(obj) in WORKLOAD_KINDS and (template := revision.engine_template(obj)) is not None
        for workload, name in status_of.deployment_names(serving).items()
        if workload != "router" and obj["metadata"]["name"] == name
    }
    if not desired:
        return None
    templates = {w: revision.engine_template(d) for w, d in live.items() if w != "router"}
    return kv_change.classify(
        templates, desired, serving.spec.kv_transfer.allow_decode_tp_below_prefill, complete=_both(templates, desired)
    )


def _both(
    live: Mapping[str, Mapping[str, Any] | None], desired: Mapping[str, Mapping[str, Any]]
) -> dict[str, Mapping[str, Any]]:
    """Both roles' templates after this pass: the desired one where it is applied, the live one elsewhere."""
    return {r: t for r in ("prefill", "decode") if (t := desired.get(r) or live.get(r)) is not None}


def _live_uid(child: Mapping[str, Any], observed: Sequence[Mapping[str, Any]]) -> str | None:
    """The uid of the child as stored, unless it is missing or on its way out."""
    for o in observed:
        meta = o.get("metadata") or {}
        if key(dict(o)) == key(dict(child)) and not meta.get("deletionTimestamp"):
            return meta.get("uid") or None
    return None


def _changes(
    desired: list[dict[str, Any]], observed: Sequence[Mapping[str, Any]], uid: str
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(to apply in table order, to delete in reverse: Deployments first, so nothing runs without its config).
    A child on its way out is left alone: deleting it again does nothing, its replacement comes once it is gone."""
    to_apply, to_delete = plan(desired, [dict(o) for o in observed], uid)
    leaving = {key(dict(o)) for o in observed if (o.get("metadata") or {}).get("deletionTimestamp")}
    return (
        sorted((o for o in to_apply if key(o) not in leaving), key=apply_rank),
        sorted((o for o in to_delete if key(o) not in leaving), key=apply_rank, reverse=True),
    )


def _warning_event(last: DisaggregatedServingStatus | None, new: DisaggregatedServingStatus) -> list[Event]:
    """Once per new set of warnings, not on every pass."""
    warning = status_of.config_warning(new)
    if warning is None or warning == status_of.config_warning(last):
        return []
    return [Event("Warning", "ConfigWarning", warning)]


def _readiness_event(last: DisaggregatedServingStatus | None, new: DisaggregatedServingStatus) -> list[Event]:
    if status_of.is_ready(new) == status_of.is_ready(last):
        return []
    if status_of.is_ready(new):
        return [Event("Normal", "Ready", "all components ready")]
    return [Event("Warning", "NotReady", status_of.ready_message(new))]


def _refused(
    generation: int | None,
    message: str,
    last: DisaggregatedServingStatus | None,
    previous: Mapping[str, Any] | None,
    at: str,
) -> SyncResult:
    new = status_of.invalid(generation, message, last, at)
    write = status_of.differs(previous, status_of.patch_body(new))
    events = [Event("Warning", "ConfigInvalid", message)] if write else []
    return SyncResult(status=new, write_status=write, events=events, invalid=message)


def _fabric_reports(serving: Serving, observed: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    name = fabric_configmap_name(serving.name)
    for o in observed:
        if o.get("kind") == CONFIG_MAP.kind and (o.get("metadata") or {}).get("name") == name:
            return dict(o.get("data") or {})
    return {}

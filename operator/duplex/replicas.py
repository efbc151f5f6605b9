"""One writer of each engine role's replicas (spec.<role>.scaling.mode).

Fixed: the operator's apply carries `replicas` and wins; a value someone else wrote is set back, with an Event.
External: the operator's apply leaves `replicas` out, so an HPA, KEDA or `kubectl scale` owns it through the
Deployment's scale subresource (a LeaderWorkerSet's, in instances, for a role whose instances span nodes).
Server-side apply deletes a field its only manager stops applying, which would reset the workload to 1 replica, so
before the first apply without it the field is applied at its live value by a second field manager (HANDOVER); the
operator's own claim then goes and the value stays. Pure: observed objects in,
handovers, desired sizes and Events out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from duplex import workloads
from duplex.converge import APPLIED_HASH, key
from duplex.render import Serving

HANDOVER = "duplex-replicas-handover"
ROLES = ("prefill", "decode")


@dataclass(frozen=True)
class Handover:
    """`replicas` applied by the HANDOVER field manager: before the operator's apply when the workload exists (its
    live value, kept), after it when the apply creates it (the spec's starting size)."""

    workload: dict[str, Any]
    before_apply: bool


def mode(serving: Serving, role: str) -> str:
    return str(getattr(serving.spec, role).scaling.mode)


def external(serving: Serving, role: str) -> bool:
    return mode(serving, role) == "External"


def desired(serving: Serving, role: str, live: Mapping[str, Any] | None) -> int:
    """The role's size as its writer wants it: the spec's, or in External and Automatic mode the live workload's
    (the planner's last decision is in it)."""
    spec_replicas = int(getattr(serving.spec, role).replicas)
    if mode(serving, role) != "Fixed" and live is not None:
        return int((live.get("spec") or {}).get("replicas", spec_replicas))
    return spec_replicas


def handovers(
    serving: Serving,
    names: Mapping[str, str],
    live: Mapping[str, Mapping[str, Any] | None],
    to_apply: list[dict[str, Any]],
) -> list[Handover]:
    """One per External role whose workload this pass applies."""
    applied = {key(o) for o in to_apply}
    out = []
    for role in ROLES:
        kind = workloads.kind(serving, role)
        if not external(serving, role) or (kind.api_version, kind.kind, names[role]) not in applied:
            continue
        current = live.get(role)
        meta = {"name": names[role], "namespace": serving.namespace}
        body = kind.manifest(meta, spec={"replicas": desired(serving, role, current)})
        out.append(Handover(body, before_apply=current is not None))
    return out


def overwritten(
    serving: Serving, live: Mapping[str, Mapping[str, Any] | None], to_apply: list[dict[str, Any]]
) -> list[tuple[str, int, int]]:
    """(role, live, spec) for each Fixed role whose workload holds exactly what the operator last applied but for
    replicas: another writer changed them, and this pass sets them back."""
    applied = {key(o): o for o in to_apply}
    out = []
    for role in ROLES:
        current = live.get(role)
        if mode(serving, role) != "Fixed" or current is None:
            continue
        mine = applied.get(key(dict(current)))
        stamped = (current["metadata"].get("annotations") or {}).get(APPLIED_HASH)
        if mine is None or stamped != (mine["metadata"].get("annotations") or {}).get(APPLIED_HASH):
            continue
        replicas = (current.get("spec") or {}).get("replicas")
        if isinstance(replicas, int) and replicas != mine["spec"]["replicas"]:
            out.append((role, replicas, mine["spec"]["replicas"]))
    return out

"""One level-triggered reconcile pass: the whole desired state from the spec, converged; safe to repeat."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from duplex import metrics, status
from duplex.converge import adopt, key, plan
from duplex.kube import Kube
from duplex.render import InvalidSpec, desired_children, parse

log = logging.getLogger("duplex.reconcile")


@dataclass
class Outcome:
    applied: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    status_written: bool = False
    ready: bool = False
    error: str | None = None


def _ref(obj: dict[str, Any]) -> str:
    return f"{obj['kind']}/{obj['metadata']['name']}"


def _ready(st: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in st.get("conditions") or [])


def reconcile_once(kube: Kube, parent: dict[str, Any]) -> Outcome:
    started = time.perf_counter()
    try:
        return _reconcile(kube, parent)
    finally:
        metrics.RECONCILE_SECONDS.observe(time.perf_counter() - started)


def _reconcile(kube: Kube, parent: dict[str, Any]) -> Outcome:
    meta = parent["metadata"]
    ns, name = meta["namespace"], meta["name"]
    previous = parent.get("status") or {}
    out = Outcome()
    try:
        serving = parse(parent, ns)
    except InvalidSpec as err:
        # Leave the children as they are: never half-apply a spec we refuse.
        out.error = str(err)
        new = status.invalid(meta.get("generation"), out.error, previous)
        if status.differs(previous, new):
            kube.patch_status(ns, name, new)
            out.status_written = True
            kube.post_event(parent, "Warning", "ConfigInvalid", out.error)
        metrics.RECONCILES.labels("invalid").inc()
        return out

    desired = [adopt(child, parent) for child in desired_children(serving)]
    live = kube.list_children(ns, name)
    to_apply, to_delete = plan(desired, live, meta["uid"])
    current = {key(o): o for o in live}
    for obj in to_apply:
        current[key(obj)] = kube.apply(obj)
        metrics.WRITES.labels("apply", obj["kind"]).inc()
        out.applied.append(_ref(obj))
    for obj in to_delete:
        kube.delete(obj)
        current.pop(key(obj), None)
        metrics.WRITES.labels("delete", obj["kind"]).inc()
        out.deleted.append(_ref(obj))
    if out.applied or out.deleted:
        log.info("%s/%s: applied %s; deleted %s", ns, name, out.applied or "-", out.deleted or "-")
        changes = ", ".join([*out.applied, *(f"-{d}" for d in out.deleted)])
        kube.post_event(parent, "Normal", "Applied", f"converged children: {changes}")

    kinds: dict[str, int] = {}
    for k in current:
        kinds[k[1]] = kinds.get(k[1], 0) + 1
    for kind, count in kinds.items():
        metrics.MANAGED_OBJECTS.labels(ns, name, kind).set(count)

    names = status.deployment_names(serving)
    deployments = {w: current.get(("apps/v1", "Deployment", n)) for w, n in names.items()}
    new = status.compute(serving, deployments, previous)
    out.ready = _ready(new)
    if status.differs(previous, new):
        kube.patch_status(ns, name, new)
        out.status_written = True
        if out.ready != _ready(previous):
            reason, msg = (
                ("Ready", "all components ready")
                if out.ready
                else ("NotReady", next(c["message"] for c in new["conditions"] if c["type"] == "Ready"))
            )
            kube.post_event(parent, "Normal" if out.ready else "Warning", reason, msg)
    metrics.RECONCILES.labels("ok").inc()
    return out

"""KV revisions: engine pods that can exchange blocks share one.

A revision is a short hash of what both roles' pod templates must agree on for prefill and decode to exchange
blocks (kv_change.kv_identity, and whether decode has fewer TP ranks than prefill). A KV-compatible change keeps it,
so old and new pods pair freely during the roll; a KV-incompatible change makes a new one, and the revisions run
side by side until the old one retires (duplex/lockstep.py). Each engine pod carries its revision three ways:
- the label `duplex.dev/kv-revision` (the operator counts a revision's pods by it);
- the environment variable DUPLEX_KV_REVISION, which the engine guard (or the simulator) sends back as the
  `X-Duplex-KV-Revision` header: the router learns each engine's revision from its health probe and pairs prefill
  and decode of one revision only;
- the readiness gate `duplex.dev/kv-paired`, which the operator opens in step with the other role (lockstep.py).
The role Services carry the revision new turns go to: Kubernetes copies a Service's labels onto its EndpointSlices,
which the routers watch.

A role whose instances span nodes (a LeaderWorkerSet) is stamped the same way, on both rank templates, with the gate
on the leader only: the leader is the instance to the routers (the role Service selects leaders), it is Ready only
once every rank has joined it, and LWS counts a group ready only when its leader is.

Pods from before revisions (no label) keep running as they are while changes stay KV-compatible: stamping them
would roll every engine on an operator upgrade. Their revision is "" until the next KV-incompatible change.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from duplex import kv_change
from duplex.children.kinds import DEPLOYMENT, LEADER_WORKER_SET, SERVICE, WORKLOAD_KINDS, ChildKind, kind_of
from duplex.children.labels import ENGINE_HASH_ANNOTATION, KV_REVISION_LABEL, ROLE_LABEL, config_hash
from duplex.children.lws import rank_templates

ENV = "DUPLEX_KV_REVISION"  # the engine guard and the simulator read it (duplex_sidecars.protocol names it too)
GATE = "duplex.dev/kv-paired"
ENGINE_ROLES = ("prefill", "decode")


def of(templates: Mapping[str, Mapping[str, Any]]) -> str:
    """The revision of a prefill and a decode pod template: 8 hex digits."""
    identity: dict[str, Any] = {role: kv_change.kv_identity(templates[role]) for role in ENGINE_ROLES}
    tp = {role: kv_change.tensor_parallel(templates[role]) for role in ENGINE_ROLES}
    identity["decodeTPBelowPrefill"] = tp["decode"] < tp["prefill"]
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:8]


def of_template(template: Mapping[str, Any] | None) -> str | None:
    """The revision a pod template is stamped with: "" before revisions, None without a template."""
    if template is None:
        return None
    return str(((template.get("metadata") or {}).get("labels") or {}).get(KV_REVISION_LABEL, ""))


def engine_template(workload: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The pod template that serves a workload's engine: a Deployment's, a LeaderWorkerSet's leader's (None: no
    workload, or not one of these kinds)."""
    kind = kind_of(dict(workload or {}))
    if kind is LEADER_WORKER_SET:
        return rank_templates(workload or {})[0]
    return ((workload or {}).get("spec") or {}).get("template") if kind is DEPLOYMENT else None


def _worker_template(workload: Mapping[str, Any]) -> dict[str, Any] | None:
    return rank_templates(workload)[1] if kind_of(dict(workload)) is LEADER_WORKER_SET else None


def _engine_role(obj: Mapping[str, Any], kinds: tuple[ChildKind, ...]) -> str | None:
    role = ((obj.get("metadata") or {}).get("labels") or {}).get(ROLE_LABEL)
    return role if kind_of(dict(obj)) in kinds and role in ENGINE_ROLES else None


def stamp(children: Sequence[dict[str, Any]], legacy: bool = False) -> list[dict[str, Any]]:
    """The children with both engine workloads' pods stamped with their revision, and the role Services labelled
    with it. `legacy`: the live engines predate revisions and this change keeps their KV: leave the pods unstamped
    (revision "") so that nothing rolls."""
    out = [copy.deepcopy(c) for c in children]
    engines = {role: c for c in out if (role := _engine_role(c, WORKLOAD_KINDS))}
    if set(engines) != set(ENGINE_ROLES):
        return out
    templates = {role: t for role, w in engines.items() if (t := engine_template(w)) is not None}
    rev = "" if legacy else of(templates)
    if not legacy:
        for role, workload in engines.items():
            _stamp_template(templates[role], rev, gate=True)
            if (worker := _worker_template(workload)) is not None:
                _stamp_template(worker, rev, gate=False)  # the leader answers for its instance
    for service in (c for c in out if _engine_role(c, (SERVICE,))):
        service["metadata"].setdefault("labels", {})[KV_REVISION_LABEL] = rev
    return out


def _stamp_template(template: dict[str, Any], rev: str, gate: bool) -> None:
    template["metadata"].setdefault("labels", {})[KV_REVISION_LABEL] = rev
    spec = template["spec"]
    for container in spec["containers"]:
        if container.get("name") == "vllm":
            container.setdefault("env", []).append({"name": ENV, "value": rev})
    if gate:
        spec["readinessGates"] = [{"conditionType": GATE}]
    template["metadata"].setdefault("annotations", {})[ENGINE_HASH_ANNOTATION] = config_hash(spec)


def predates(
    live: Mapping[str, Mapping[str, Any] | None], desired: Sequence[Mapping[str, Any]], decode_tp_below: bool
) -> bool:
    """Whether the live engine pods predate revisions (an engine workload's template has no revision label) and
    the desired templates keep their KV: then they stay unstamped (`stamp(legacy=True)`). `decode_tp_below`:
    kvTransfer.allowDecodeTPBelowPrefill."""
    templates = {r: engine_template(w) for r, w in live.items() if r in ENGINE_ROLES}
    if not any(of_template(t) == "" for t in templates.values()):
        return False
    wanted = {
        role: t for c in desired if (role := _engine_role(c, WORKLOAD_KINDS)) and (t := engine_template(c)) is not None
    }
    change = kv_change.classify(templates, wanted, decode_tp_below)
    return change is None or change.verdict == "Compatible"

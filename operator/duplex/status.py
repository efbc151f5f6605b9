"""Pure status aggregation: live child Deployments + the spec -> the parent's status and conditions."""

from __future__ import annotations

import datetime
from typing import Any

from duplex.children.engine import engine_config_hash
from duplex.children.kv_config import effective
from duplex.children.labels import child_name
from duplex.children.services import router_endpoint
from duplex.render import Serving

WORKLOADS = ("prefill", "decode", "router")


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def role_status(desired: int, deployment: dict[str, Any] | None) -> dict[str, Any]:
    st = (deployment or {}).get("status") or {}
    meta = (deployment or {}).get("metadata") or {}
    current = st.get("observedGeneration", 0) >= meta.get("generation", 1)
    ready = st.get("readyReplicas", 0) or 0
    updated = (st.get("updatedReplicas", 0) or 0) if current else 0
    return {
        "replicas": desired,
        "readyReplicas": ready,
        "updatedReplicas": updated,
        "summary": f"{ready}/{desired}",
    }


def outdated_pods(deployment: dict[str, Any] | None) -> int:
    """Pods still on an old template: during a surge roll the counts can look complete while these serve."""
    st = (deployment or {}).get("status") or {}
    return max(0, (st.get("replicas", 0) or 0) - (st.get("updatedReplicas", 0) or 0))


def _role_condition(kind: str, rs: dict[str, Any], deployment: dict[str, Any] | None) -> tuple[str, str, str]:
    desired, ready, updated = rs["replicas"], rs["readyReplicas"], rs["updatedReplicas"]
    if deployment is None:
        return "False", "NotCreated", f"{kind} Deployment does not exist yet"
    if desired == 0:
        return "False", "ScaledToZero", f"{kind} has 0 replicas"
    old = outdated_pods(deployment)
    if old:
        return "False", "RollingOut", f"{updated}/{desired} {kind} pods updated, {old} old still running"
    if ready >= desired and updated >= desired:
        return "True", "AllReplicasReady", f"{ready}/{desired} {kind} pods ready"
    return "False", "ReplicasNotReady", f"{ready}/{desired} {kind} pods ready, {updated} updated"


def _condition(
    previous: dict[str, dict[str, Any]], ctype: str, status: str, reason: str, message: str, generation: int | None
) -> dict[str, Any]:
    before = previous.get(ctype)
    changed = before is None or before.get("status") != status
    return {
        "type": ctype,
        "status": status,
        "reason": reason,
        "message": message,
        "observedGeneration": generation,
        "lastTransitionTime": now() if changed else before.get("lastTransitionTime", now()),
    }


def compute(
    serving: Serving, deployments: dict[str, dict[str, Any] | None], previous: dict[str, Any] | None
) -> dict[str, Any]:
    """The parent's status; `deployments` maps prefill/decode/router to the live Deployment (or None)."""
    spec, gen = serving.spec, serving.generation
    prev_conditions = {c["type"]: c for c in (previous or {}).get("conditions") or []}
    desired = {"prefill": spec.prefill.replicas, "decode": spec.decode.replicas, "router": spec.router.replicas}
    roles = {w: role_status(desired[w], deployments.get(w)) for w in WORKLOADS}
    names = {"prefill": "PrefillReady", "decode": "DecodeReady", "router": "RouterReady"}
    conditions = [_condition(prev_conditions, "ConfigValid", "True", "Valid", "spec accepted", gen)]
    all_ready = True
    for w in WORKLOADS:
        st, reason, msg = _role_condition(w, roles[w], deployments.get(w))
        all_ready &= st == "True"
        conditions.append(_condition(prev_conditions, names[w], st, reason, msg, gen))
    rolling = [w for w in WORKLOADS if roles[w]["updatedReplicas"] < desired[w] or outdated_pods(deployments.get(w))]
    conditions.append(
        _condition(
            prev_conditions,
            "Progressing",
            "True" if rolling else "False",
            "RollingOut" if rolling else "Stable",
            f"rolling out: {', '.join(rolling)}" if rolling else "all workloads on the current spec",
            gen,
        )
    )
    not_ready = [names[w] for w in WORKLOADS if conditions[1 + WORKLOADS.index(w)]["status"] != "True"]
    conditions.insert(
        0,
        _condition(
            prev_conditions,
            "Ready",
            "True" if all_ready else "False",
            "AllComponentsReady" if all_ready else "ComponentsNotReady",
            "prefill, decode and router are ready" if all_ready else f"not ready: {', '.join(not_ready)}",
            gen,
        ),
    )
    return {
        "observedGeneration": gen,
        **roles,
        "routerEndpoint": router_endpoint(spec, serving.name, serving.namespace),
        "effectiveKV": effective(spec),
        "engineConfigHash": engine_config_hash(spec, serving.name, serving.namespace),
        "conditions": conditions,
    }


def invalid(generation: int | None, message: str, previous: dict[str, Any] | None) -> dict[str, Any]:
    """Status for a spec the operator refuses: ConfigValid=False, Ready=False, children left as they were."""
    prev_conditions = {c["type"]: c for c in (previous or {}).get("conditions") or []}
    keep = [c for c in (previous or {}).get("conditions") or [] if c["type"] not in ("ConfigValid", "Ready")]
    return {
        "observedGeneration": generation,
        "conditions": [
            _condition(prev_conditions, "Ready", "False", "ConfigInvalid", message, generation),
            _condition(prev_conditions, "ConfigValid", "False", "ConfigInvalid", message, generation),
            *keep,
        ],
    }


def deployment_names(serving: Serving) -> dict[str, str]:
    return {w: child_name(serving.name, w) for w in WORKLOADS}


def differs(old: dict[str, Any] | None, new: dict[str, Any]) -> bool:
    """Whether writing `new` changes anything (timestamps of unchanged conditions are carried over)."""
    return any((old or {}).get(k) != v for k, v in new.items())

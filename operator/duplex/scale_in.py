"""Scale-in removes the cheapest decode pod: the one the fewest conversations are bound to.

The routers count their live bindings per decode engine and put them in their fabric reports (every 30 s, with the
heartbeat: no write per request). When a pass lowers the decode Deployment's replicas it first sets
`controller.kubernetes.io/pod-deletion-cost` on every decode pod to its bindings, so that the ReplicaSet deletes the
pods holding the fewest first (a pod going away still drains what it holds, children/lifecycle.py). With scaling.mode
External an autoscaler lowers them unseen, so every pass keeps the costs current. Pure: the pass's inputs -> the
pods' annotation patches.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from duplex.children.kinds import POD
from duplex.children.labels import HTTP_PORT, ROLE_LABEL, SERVING_LABEL

DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"


def bindings(reports: Sequence[tuple[str, Mapping[str, Any]]]) -> dict[str, int]:
    """Bindings per decode address over the routers' fresh reports. Routers sharing a Redis store count the same
    bindings, so the largest count stands (a memory store has one router)."""
    out: dict[str, int] = {}
    for _, report in reports:
        for address, count in (report.get("bindings") or {}).items():
            if isinstance(count, int) and not isinstance(count, bool):
                out[address] = max(out.get(address, 0), count)
    return out


def _address(pod: Mapping[str, Any]) -> str | None:
    ip = (pod.get("status") or {}).get("podIP")
    if not ip:
        return None
    return f"[{ip}]:{HTTP_PORT}" if ":" in ip else f"{ip}:{HTTP_PORT}"


def deletion_costs(
    serving: str,
    scaling_in: bool,
    pods: Sequence[Mapping[str, Any]],
    reports: Sequence[tuple[str, Mapping[str, Any]]],
) -> list[dict[str, Any]]:
    """Annotation patches (minimal Pod objects) for the decode pods when decode may be scaled in (this pass lowers
    its replicas, or another writer owns them); [] otherwise, and for pods whose cost is already what it should be."""
    if not scaling_in:
        return []
    counts = bindings(reports)
    patches = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        labels = meta.get("labels") or {}
        if labels.get(SERVING_LABEL) != serving or labels.get(ROLE_LABEL) != "decode" or meta.get("deletionTimestamp"):
            continue
        address = _address(pod)
        cost = str(counts.get(address, 0)) if address else "0"
        if (meta.get("annotations") or {}).get(DELETION_COST) == cost:
            continue
        patches.append(
            POD.manifest(
                {"name": meta["name"], "namespace": meta.get("namespace"), "annotations": {DELETION_COST: cost}}
            )
        )
    return patches

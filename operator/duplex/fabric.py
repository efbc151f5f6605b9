"""FabricReady: what the engine pods' preflight init containers found (children/preflight.py renders them).

Each preflight writes a compact JSON report to its termination message (sidecars/duplex_sidecars/preflight): the
kubelet keeps it in the pod's status, under the init container's state (or lastState after a restart). Pure:
observed pods -> (status, reason, message). The reason of a failure names the first failed check in CamelCase
(efa_devices -> EfaDevices), its message says what to fix.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from duplex.api.spec import DisaggregatedServingSpec
from duplex.children import preflight
from duplex.children.labels import ROLE_LABEL, SERVING_LABEL

Verdict = tuple[Literal["True", "False", "Unknown"], str, str]


def report(pod: Mapping[str, Any]) -> dict[str, Any] | None:
    """The preflight report of a pod, from the last time its preflight container terminated, or None."""
    for st in (pod.get("status") or {}).get("initContainerStatuses") or []:
        if st.get("name") != preflight.CONTAINER:
            continue
        for state in (st.get("state") or {}, st.get("lastState") or {}):
            message = (state.get("terminated") or {}).get("message")
            if message:
                try:
                    doc = json.loads(message)
                except ValueError:
                    return {"ok": False, "checks": [], "unreadable": message[:200]}
                return doc if isinstance(doc, dict) else None
    return None


def _camel(name: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in name.split("_")) or "PreflightFailed"


def _failure(doc: Mapping[str, Any]) -> tuple[str, str]:
    if "unreadable" in doc:
        return "PreflightUnreadable", f"the termination message is not a preflight report: {doc['unreadable']!r}"
    bad = [c for c in doc.get("checks") or [] if c.get("status") == "fail"] or [
        c
        for c in doc.get("checks") or []
        if c.get("status") == "warn"  # --strict: a warning failed the pod
    ]
    if not bad:
        return "PreflightFailed", "preflight failed"
    first = bad[0]
    return _camel(str(first.get("name", ""))), f"{first.get('name')}: {first.get('message') or first.get('value', '')}"


def fabric_ready(spec: DisaggregatedServingSpec, serving: str, pods: Iterable[Mapping[str, Any]]) -> Verdict:
    if not preflight.enabled(spec):
        return "Unknown", "NotChecked", "no preflight (network.preflight.enabled, default: with network.efa.enabled)"
    engines = sorted(
        (p for p in pods if _is_engine_of(p, serving) and not (p.get("metadata") or {}).get("deletionTimestamp")),
        key=lambda p: p["metadata"]["name"],
    )
    reports = [(p["metadata"]["name"], report(p)) for p in engines]
    failed = [(name, doc) for name, doc in reports if doc is not None and not doc.get("ok")]
    if failed:
        name, doc = failed[0]
        reason, message = _failure(doc)
        more = f" (and {len(failed) - 1} more pods)" if len(failed) > 1 else ""
        return "False", reason, f"pod {name}: {message}{more}"
    done = [doc for _, doc in reports if doc is not None]
    if not done:
        return "Unknown", "Pending", "no engine pod has finished its preflight yet"
    backends = sorted({str(doc.get("backend")) for doc in done})
    warned = sum(1 for doc in done for c in doc.get("checks") or [] if c.get("status") == "warn")
    tail = f", {warned} warnings" if warned else ""
    return (
        "True",
        "PreflightPassed",
        f"{len(done)}/{len(engines)} engine pods passed preflight ({', '.join(backends)}{tail})",
    )


def _is_engine_of(pod: Mapping[str, Any], serving: str) -> bool:
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return labels.get(SERVING_LABEL) == serving and labels.get(ROLE_LABEL) in ("prefill", "decode")

"""What the operator's identity must be allowed, derived from what it does: the child-kind table, the parent API,
Events, the rights it hands the router, and the requests kopf itself makes. The chart's ClusterRole grants exactly
this; tests/unit/operator/test_permissions.py holds it to that, in both directions."""

from __future__ import annotations

from duplex.api.meta import GROUP, PLURAL
from duplex.children.kinds import CHILD_KINDS, OBSERVED_KINDS
from duplex.children.router import ROUTER_RULES

Permission = tuple[str, str, str]  # (API group, resource, verb)


def _all(group: str, resource: str, *verbs: str) -> set[Permission]:
    return {(group, resource, verb) for verb in verbs}


def required() -> set[Permission]:
    out: set[Permission] = set()
    for kind in (*CHILD_KINDS, *OBSERVED_KINDS):
        out |= _all(kind.group, kind.plural, *kind.verbs)
    # The parent: kopf lists and watches it, and patches it only to take off the finalizer earlier versions left.
    out |= _all(GROUP, PLURAL, "list", "watch", "patch")
    out |= _all(GROUP, f"{PLURAL}/status", "patch")
    # The KV-revision readiness gate on engine pods (lockstep.py).
    out |= _all("", "pods/status", "patch")
    # Events on the parent, ours and kopf's, are core/v1 Events; ours are patched to count a repeat.
    out |= _all("", "events", "create", "patch")
    # kopf follows CRDs (to notice its resources change) and, when told which namespaces to serve, namespaces.
    out |= _all("apiextensions.k8s.io", "customresourcedefinitions", "list", "watch")
    out |= _all("", "namespaces", "list", "watch")
    # RBAC lets the operator grant only what it holds itself: everything in the router's Role.
    for rule in ROUTER_RULES:
        out |= {(g, r, v) for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}
    return out

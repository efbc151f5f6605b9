"""The kinds of object a DisaggregatedServing owns, declared once (Metacontroller's `childResources`).

The builders stamp apiVersion and kind from here, the operator watches each kind, applies children in this order
and deletes them in reverse, and a unit test checks the operator's ClusterRole against this table.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# What the operator does with a child kind: kopf watches it (an initial LIST, then WATCH), server-side apply
# PATCHes it (and needs `create` when the object does not exist yet), stale children are deleted.
CHILD_VERBS = ("list", "watch", "create", "patch", "delete")
# A kind the operator only creates once and never changes, and does not watch (the engine key Secret): read by name
# on each pass, created when missing. No list or watch, so the operator can read no Secret it does not name; no
# delete, since its owner reference lets the garbage collector remove it with its serving.
CREATE_ONLY_VERBS = ("get", "create")


@dataclass(frozen=True)
class ChildKind:
    group: str  # "" for the core API group
    version: str
    kind: str
    plural: str
    namespaced: bool = True
    verbs: tuple[str, ...] = CHILD_VERBS
    watched: bool = True  # listed and watched (its own kopf index); else read by name in each pass
    optional: bool = False  # its CRD may be absent: kopf watches the kind only while the cluster serves it

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def manifest(self, metadata: dict[str, Any], **fields: Any) -> dict[str, Any]:
        """An object of this kind: apiVersion, kind, metadata, then the kind's own fields in the order given."""
        return {"apiVersion": self.api_version, "kind": self.kind, "metadata": metadata, **fields}


SERVICE_ACCOUNT = ChildKind("", "v1", "ServiceAccount", "serviceaccounts")
ROLE = ChildKind("rbac.authorization.k8s.io", "v1", "Role", "roles")
ROLE_BINDING = ChildKind("rbac.authorization.k8s.io", "v1", "RoleBinding", "rolebindings")
CONFIG_MAP = ChildKind("", "v1", "ConfigMap", "configmaps")
SERVICE = ChildKind("", "v1", "Service", "services")
# Created once with a random key, never patched: rotating the key on a pass would cut the router off the engines.
SECRET = ChildKind("", "v1", "Secret", "secrets", verbs=CREATE_ONLY_VERBS, watched=False)
NETWORK_POLICY = ChildKind("networking.k8s.io", "v1", "NetworkPolicy", "networkpolicies")
DEPLOYMENT = ChildKind("apps", "v1", "Deployment", "deployments")
# The engine workload of a role whose instance spans nodes (nodesPerInstance above 1): one group of pods per instance.
# Optional like the pool below: a cluster without LWS's CRD runs single-node roles as before, and a multi-node role's
# apply fails with 404 (an ExtensionMissing Event), after every other workload.
LEADER_WORKER_SET = ChildKind("leaderworkerset.x-k8s.io", "v1", "LeaderWorkerSet", "leaderworkersets", optional=True)
# The Gateway API Inference Extension's pool of the router pods, with router.inferencePool.enabled only. Clusters
# without the extension's CRD run as before: kopf follows CRDs and serves a watched kind only once its CRD exists.
# A serving that enables the pool there fails its pass on this apply (404), which comes last, after its workloads.
INFERENCE_POOL = ChildKind("inference.networking.k8s.io", "v1", "InferencePool", "inferencepools", optional=True)

# Apply order: the router's identity, its config, the engine key and the policies exist before the workloads that
# mount, read or are fenced by them; kinds whose CRD may be missing come last.
CHILD_KINDS: tuple[ChildKind, ...] = (
    SERVICE_ACCOUNT,
    ROLE,
    ROLE_BINDING,
    CONFIG_MAP,
    SECRET,
    SERVICE,
    NETWORK_POLICY,
    DEPLOYMENT,
    LEADER_WORKER_SET,
    INFERENCE_POOL,
)
WATCHED_CHILD_KINDS = tuple(k for k in CHILD_KINDS if k.watched)
# The kinds that run pods: their pods read the engine key, so they wait until its Secret exists (sync.py).
WORKLOAD_KINDS = (DEPLOYMENT, LEADER_WORKER_SET)

# Watched for what they report, never written: engine pods (their preflight results). Pods are owned by ReplicaSets,
# so the shell finds a pod's parent by its serving label.
# Watched for the preflight reports; patched only for a decode scale-in's deletion costs (duplex/scale_in.py).
POD = ChildKind("", "v1", "Pod", "pods", verbs=("list", "watch", "patch"))
OBSERVED_KINDS: tuple[ChildKind, ...] = (POD,)

_BY_TYPE = {(k.api_version, k.kind): k for k in CHILD_KINDS}


def kind_of(obj: Mapping[str, Any]) -> ChildKind | None:
    """The table entry of an object, or None for a kind the operator does not own."""
    return _BY_TYPE.get((obj.get("apiVersion", ""), obj.get("kind", "")))


def apply_rank(obj: Mapping[str, Any]) -> int:
    """Position of the object's kind in the apply order (unknown kinds last)."""
    kind = kind_of(obj)
    return CHILD_KINDS.index(kind) if kind is not None else len(CHILD_KINDS)

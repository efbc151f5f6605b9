"""Parents and their children as the watch would deliver them, for the tests of the sync core and its shell."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from dsv_helpers import doc, spec_dict

from duplex import status
from duplex.apierrors import ApiError
from duplex.converge import owner_reference, with_owner
from duplex.render import desired_children, key_secret, parse
from duplex.sync import sync

T0, T1 = "2026-01-01T00:00:00Z", "2026-01-01T00:05:00Z"
UID = "uid-1"
ALL = [
    "ServiceAccount/demo-router",
    "Role/demo-router",
    "RoleBinding/demo-router",
    "ConfigMap/demo-router",
    "ConfigMap/demo-fabric",
    "ConfigMap/demo-guard",
    "Service/demo-prefill",
    "Service/demo-decode",
    "Service/demo-router",
    "Service/demo-drain",
    "NetworkPolicy/demo-prefill",
    "NetworkPolicy/demo-decode",
    "NetworkPolicy/demo-router",
    "Deployment/demo-prefill",
    "Deployment/demo-decode",
    "Deployment/demo-router",
]
KEY_SECRET = "Secret/demo-engine-key"  # created once by the shell, never applied
KEY_UID = "uid-demo-engine-key-Secret"
FIRST = [ref for ref in ALL if not ref.startswith("Deployment/")]  # a new parent: workloads wait for the key
Objects = list[dict[str, Any]]


def parent(patch: dict[str, Any] | None = None, generation: int = 3) -> dict[str, Any]:
    return doc(spec_dict(patch), name="demo", namespace="ns1", uid=UID, generation=generation)


def observed(of: dict[str, Any], ready: bool = True) -> Objects:
    """The children as the watch delivers them once converged: applied, then stored (uid, resourceVersion), and the
    Deployments rolled out (all pods ready unless `ready` is False)."""
    out = []
    secret = copy.deepcopy(with_owner(key_secret(parse(of)), of))
    secret["metadata"].update(uid=KEY_UID, resourceVersion="7")
    out.append({**secret, "data": {"api-key": "c2VjcmV0"}})
    for child in desired_children(parse(of), KEY_UID):
        live = copy.deepcopy(with_owner(child, of))
        live["metadata"].update(uid=f"uid-{live['metadata']['name']}-{live['kind']}", resourceVersion="7")
        if live["kind"] == "Deployment":
            n = live["spec"].setdefault("replicas", 1)  # scaling.mode External: as its writer left it
            live["metadata"]["generation"] = 1
            live["status"] = {
                "observedGeneration": 1,
                "replicas": n,
                "updatedReplicas": n,
                "readyReplicas": n if ready else 0,
                "availableReplicas": n if ready else 0,
            }
        out.append(live)
    return out


def converged_status(of: dict[str, Any], children: Objects) -> dict[str, Any]:
    """The status a previous pass wrote for exactly this state."""
    return status.patch_body(sync(of, children, None, at=T0).status)


def edit(objs: Objects, ref: str, fn: Callable[[dict[str, Any]], None]) -> Objects:
    objs = copy.deepcopy(objs)
    kind, name = ref.split("/")
    (target,) = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    fn(target)
    return objs


def stale(kind: str, api_version: str, name: str, owner_uid: str | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ns1", "uid": f"uid-{name}", "resourceVersion": "3"}
    if owner_uid is not None:
        meta["ownerReferences"] = [{**owner_reference(parent()), "uid": owner_uid}]
    return {"apiVersion": api_version, "kind": kind, "metadata": meta}


def refs(objs: Objects) -> list[str]:
    return [f"{o['kind']}/{o['metadata']['name']}" for o in objs]


P = parent()
LIVE = observed(P)
LIVE_LOADING = observed(P, ready=False)
READY = converged_status(P, LIVE)
LOADING = converged_status(P, LIVE_LOADING)
SCALED = parent({"decode": {"replicas": 2}})
BAD = parent({"router": {"conversation": {"ttl": 480}}})  # not strictly below decodeBlocksTTL (480)


class RecordingKube:
    """Records each write; answers like the API server would (the object as stored)."""

    def __init__(self, fail_apply: ApiError | None = None, exists: bool = False, owner: str | None = UID) -> None:
        self.calls: list[tuple[str, str]] = []
        self.fail_apply = fail_apply
        self.exists = exists  # create answers AlreadyExists, and get the Secret with this `owner` uid (None: no owner)
        self.owner = owner
        self.messages: list[str] = []
        self.created: list[dict[str, Any]] = []
        self.applied: list[dict[str, Any]] = []

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(("create", *refs([obj])))
        if self.exists:
            raise ApiError(status=409, reason="AlreadyExists")
        self.created.append(obj)
        stored = copy.deepcopy(obj)
        stored["metadata"]["uid"] = f"uid-{len(self.created)}"  # the API server gives it one
        return stored

    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        if self.fail_apply is not None:
            raise self.fail_apply
        self.calls.append(("apply", *refs([obj])))
        self.applied.append(obj)
        stored = copy.deepcopy(obj)
        stored["metadata"]["resourceVersion"] = "8"
        return stored

    def annotate_pod(self, pod: dict[str, Any]) -> None:
        self.calls.append(("annotate", *refs([pod])))

    def patch_pod_status(self, pod: dict[str, Any]) -> None:
        self.calls.append(("pod_status", *refs([pod])))

    def hand_over(self, obj: dict[str, Any], manager: str) -> dict[str, Any]:
        self.calls.append((f"hand_over:{manager}", *refs([obj])))
        return copy.deepcopy(obj)

    def get(self, obj: dict[str, Any]) -> dict[str, Any] | None:
        self.calls.append(("get", *refs([obj])))
        if not self.exists:
            return None
        owners = [{"kind": "DisaggregatedServing", "name": "other", "uid": self.owner}] if self.owner else []
        return {**obj, "metadata": {**obj["metadata"], "uid": "uid-existing", "ownerReferences": owners}}

    def delete(self, obj: dict[str, Any]) -> None:
        self.calls.append(("delete", *refs([obj])))

    def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(("status", f"{namespace}/{name}"))
        return {"status": status}

    def post_event(self, parent: dict[str, Any], type_: str, reason: str, message: str) -> None:
        self.calls.append(("event", f"{type_}/{reason}"))
        self.messages.append(message)

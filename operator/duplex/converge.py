"""Pure decisions of the reconcile loop: does a live object already hold what we want applied?

A no-op resync must make zero write calls, so each child is applied only when the live object does not already
cover the desired fields (fields others own, and server-side defaults, are ignored).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from duplex.api.quantity import quantity

_EMPTY: tuple[object, ...] = (None, [], {}, "")
# The API server omits zero values (omitempty), so an absent live field covers a desired false or 0.
_ZERO = (False, 0)


def _same_scalar(live: Any, desired: Any) -> bool:
    if live == desired:
        return True
    if isinstance(live, str) and isinstance(desired, str):
        try:
            return quantity(live) == quantity(desired)  # "0.5" vs "500m", "1024Mi" vs "1Gi"
        except ValueError:
            return False
    if (isinstance(live, (int, float)) and isinstance(desired, str)) or (
        isinstance(desired, (int, float)) and isinstance(live, str)
    ):
        return str(live) == str(desired)
    return False


def covers(live: Any, desired: Any) -> bool:
    """True when every field of desired is present in live with an equal value (lists element by element)."""
    if desired in _EMPTY and live in _EMPTY:
        return True
    if live is None and any(desired is z or (type(desired) is type(z) and desired == z) for z in _ZERO):
        return True
    if isinstance(desired, dict):
        return isinstance(live, dict) and all(covers(live.get(k), v) for k, v in desired.items())
    if isinstance(desired, list):
        return isinstance(live, list) and len(live) == len(desired) and all(map(covers, live, desired))
    return _same_scalar(live, desired)


def key(obj: dict[str, Any]) -> tuple[str, str, str]:
    return obj["apiVersion"], obj["kind"], obj["metadata"]["name"]


def owner_reference(parent: dict[str, Any]) -> dict[str, Any]:
    meta = parent["metadata"]
    return {
        "apiVersion": parent["apiVersion"],
        "kind": parent["kind"],
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


APPLIED_HASH = "duplex.dev/applied-hash"


def with_owner(child: dict[str, Any], parent: dict[str, Any]) -> dict[str, Any]:
    """The child as applied: owned by the parent and stamped with a hash of its desired content, so that removing a
    setting (which `covers` cannot see) still changes the object and server-side apply drops the removed fields."""
    out = dict(child)
    meta = {**child["metadata"], "ownerReferences": [owner_reference(parent)]}
    digest = hashlib.sha256(json.dumps({**out, "metadata": meta}, sort_keys=True).encode()).hexdigest()[:16]
    meta["annotations"] = {**(meta.get("annotations") or {}), APPLIED_HASH: digest}
    out["metadata"] = meta
    return out


def owned_by(obj: dict[str, Any], uid: str) -> bool:
    return any(ref.get("uid") == uid for ref in obj.get("metadata", {}).get("ownerReferences") or [])


def plan(
    desired: list[dict[str, Any]], live: list[dict[str, Any]], parent_uid: str
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(objects to apply, live objects to delete): apply what is missing or drifted, delete stale owned children."""
    live_by_key = {key(o): o for o in live}
    to_apply = [d for d in desired if not covers(live_by_key.get(key(d)), d)]
    wanted = {key(d) for d in desired}
    to_delete = [o for k, o in live_by_key.items() if k not in wanted and owned_by(o, parent_uid)]
    return to_apply, to_delete

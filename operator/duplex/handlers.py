"""kopf handlers: a thin shell around the work queue and its workers (workers.py).

kopf's watch streams keep in-memory indices: the DisaggregatedServings by uid, and each child kind by the uid in
its owner reference (not by a label users can edit). Every event of a parent, or of a child it owns, puts the
parent's uid on the queue; workers started at startup run one level-triggered pass per uid and resync it later.

No daemon and no timer per object, so kopf puts no finalizer on DisaggregatedServings: deleting one never waits
for the operator, and its children are garbage-collected through their owner references.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import os
from collections.abc import Mapping
from typing import Any

import kopf

from duplex.api.meta import GROUP, KIND, PLURAL, VERSION
from duplex.children.kinds import POD, WATCHED_CHILD_KINDS, ChildKind
from duplex.children.labels import MANAGED_BY, ROLE_LABEL, SERVING_LABEL
from duplex.kube import Kube, load_config
from duplex.workers import CONCURRENCY, SETTLE_SECONDS, Caches, Workers
from duplex.workqueue import WorkQueue

log = logging.getLogger("duplex.operator")

RESYNC_SECONDS = float(os.environ.get("DUPLEX_RESYNC_SECONDS", "60"))
WORKERS = int(os.environ.get("DUPLEX_WORKERS", CONCURRENCY))
# Earlier versions ran a daemon per object, for which kopf kept this finalizer on every DisaggregatedServing. Naming
# it here is what lets kopf take it off such objects: nothing requires a finalizer any more.
LEGACY_FINALIZER = f"{GROUP}/operator"


def index_id(kind: ChildKind) -> str:
    return f"{kind.plural}_by_owner"


def owner_uids(meta: Mapping[str, Any]) -> list[str]:
    """uids of the DisaggregatedServings that own an object, from its ownerReferences."""
    refs = meta.get("ownerReferences") or []
    return [r["uid"] for r in refs if r.get("kind") == KIND and str(r.get("apiVersion", "")).startswith(f"{GROUP}/")]


def _cached(body: kopf.Body) -> dict[str, Any]:
    """A plain copy of an object for the indices; managedFields are large and never read."""
    # A Secret's data is never read (the engine key stays out of the operator's memory).
    obj = copy.deepcopy(
        {k: body[k] for k in body if not (body.get("kind") == "Secret" and k in ("data", "stringData"))}
    )
    obj.get("metadata", {}).pop("managedFields", None)
    return obj


def bearer_token(cfg: Any) -> str | None:
    """A kubeconfig's bearer token, wherever the client keeps it (kubernetes 36 on: api_key["BearerToken"])."""
    for key in ("BearerToken", "authorization"):
        value = cfg.get_api_key_with_prefix(key)
        if value:
            return str(value).removeprefix("Bearer ").strip() or None
    return None


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """An explicit --kubeconfig wins; otherwise kopf's usual in-cluster/kubeconfig discovery."""
    path = os.environ.get("DUPLEX_KUBECONFIG")
    if not path:
        return kopf.login_via_client(**kwargs)
    from kubernetes import client, config

    cfg = client.Configuration()
    config.load_kube_config(config_file=path, client_configuration=cfg)
    return kopf.ConnectionInfo(
        server=cfg.host,
        ca_path=cfg.ssl_ca_cert,
        insecure=not cfg.verify_ssl,
        token=bearer_token(cfg),
        certificate_path=cfg.cert_file,
        private_key_path=cfg.key_file,
    )


@kopf.on.startup()
async def start(settings: kopf.OperatorSettings, memo: kopf.Memo, **indices: Any) -> None:
    settings.persistence.finalizer = LEGACY_FINALIZER
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.watching.connect_timeout = 10
    settings.networking.request_timeout = 60
    settings.networking.error_backoffs = [1, 2, 4, 8, 15]
    settings.peering.standalone = True
    if logging.getLogger().getEffectiveLevel() > logging.DEBUG:
        # kopf logs each event handler's success at INFO: one line per child event, nothing worth reading.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    for kind in (
        *WATCHED_CHILD_KINDS,
        POD,
    ):  # the server filters the child watches: the indices hold only what we manage
        settings.watching.label_selectors[kind.group, kind.version, kind.plural] = (
            f"app.kubernetes.io/managed-by={MANAGED_BY}"
        )
    # kopf hands startup handlers its indices empty; the watch streams fill them before any event handler runs.
    caches = Caches(
        servings=indices["servings"],
        children=tuple(indices[index_id(kind)] for kind in WATCHED_CHILD_KINDS),
        pods=indices["engine_pods"],
    )
    kube = Kube(load_config(os.environ.get("DUPLEX_KUBECONFIG") or None, WORKERS))  # fails fast on a bad kubeconfig
    memo.queue = WorkQueue[str]()
    memo.workers = asyncio.create_task(Workers(memo.queue, caches, kube, RESYNC_SECONDS).run(WORKERS), name="reconcile")


@kopf.on.cleanup()
async def stop(memo: kopf.Memo, **_: Any) -> None:
    task: asyncio.Task[None] | None = getattr(memo, "workers", None)
    if task is not None:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


@kopf.index(GROUP, VERSION, PLURAL)
async def servings(uid: str, body: kopf.Body, **_: Any) -> dict[str, dict[str, Any]]:
    return {uid: _cached(body)}


async def _by_owner(body: kopf.Body, meta: kopf.Meta, **_: Any) -> dict[str, dict[str, Any]] | None:
    return {uid: _cached(body) for uid in owner_uids(meta)} or None


@kopf.on.event(GROUP, VERSION, PLURAL)
async def parent_changed(uid: str, memo: kopf.Memo, **_: Any) -> None:
    memo.queue.add(uid, SETTLE_SECONDS)


async def _child_changed(meta: kopf.Meta, memo: kopf.Memo, **_: Any) -> None:
    for uid in owner_uids(meta):
        memo.queue.add(uid, SETTLE_SECONDS)


for _kind in WATCHED_CHILD_KINDS:
    kopf.index(group=_kind.group, version=_kind.version, plural=_kind.plural, id=index_id(_kind))(_by_owner)
    kopf.on.event(group=_kind.group, version=_kind.version, plural=_kind.plural, id=f"{_kind.plural}_changed")(
        _child_changed
    )


def _pod_key(meta: Mapping[str, Any]) -> str | None:
    """ "namespace/serving" of an engine pod, from its labels (pods are owned by ReplicaSets, not by the parent)."""
    labels = meta.get("labels") or {}
    if labels.get(ROLE_LABEL) not in ("prefill", "decode") or not labels.get(SERVING_LABEL):
        return None
    return f"{meta.get('namespace')}/{labels[SERVING_LABEL]}"


@kopf.index(POD.group, POD.version, POD.plural)
async def engine_pods(body: kopf.Body, meta: kopf.Meta, **_: Any) -> dict[str, dict[str, Any]] | None:
    """Only what the status reads: names, labels, the init containers' states (their preflight reports, for
    FabricReady) and the pod IP (the router's canary names its engines by it, for DisaggregationVerified)."""
    where = _pod_key(meta)
    if where is None:
        return None
    kept = {k: meta[k] for k in ("name", "namespace", "labels", "deletionTimestamp") if meta.get(k)}
    observed = body.get("status") or {}
    status: dict[str, Any] = {
        "initContainerStatuses": copy.deepcopy(list(observed.get("initContainerStatuses") or [])),
        # readiness and the KV-revision gate (lockstep.py)
        "conditions": [{"type": c.get("type"), "status": c.get("status")} for c in observed.get("conditions") or []],
    }
    if observed.get("podIP"):
        status["podIP"] = observed["podIP"]
    return {where: {"apiVersion": "v1", "kind": POD.kind, "metadata": kept, "status": status}}


@kopf.on.event(POD.group, POD.version, POD.plural)
async def engine_pod_changed(meta: kopf.Meta, memo: kopf.Memo, **kwargs: Any) -> None:
    """Wakes the pod's parent, found by namespace and name in the servings index (kopf passes indices by name)."""
    where = _pod_key(meta)
    if where is None:
        return
    for uid, parents in kwargs["servings"].items():
        for parent in parents:
            if f"{parent['metadata']['namespace']}/{parent['metadata']['name']}" == where:
                memo.queue.add(uid, SETTLE_SECONDS)

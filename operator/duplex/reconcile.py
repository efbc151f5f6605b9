"""One reconcile pass: the imperative shell around `sync`. It runs the pure core on what the watch observed, then
does what the core decided: apply, delete, write status, post Events (the core's, and an Applied Event naming the
children the cluster took). Blocking I/O; the workers run it in a thread."""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from duplex import metrics, replicas, status
from duplex.apierrors import ApiError, Failure
from duplex.children.engine_key import secret_name, with_fresh_key
from duplex.children.kinds import CHILD_KINDS, SECRET, kind_of
from duplex.converge import key, owned_by
from duplex.kube import Kube
from duplex.policy import Policy
from duplex.sync import Event, sync

log = logging.getLogger("duplex.reconcile")
POLICY = Policy.from_env()  # the operator's flags (operator_cli), read once by its workers


@dataclass
class Outcome:
    applied: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    status_written: bool = False
    ready: bool = False
    invalid: str | None = None

    @property
    def wrote(self) -> bool:
        """Whether the pass changed anything; the watch will bring those changes back as events."""
        return bool(self.applied or self.deleted or self.status_written)


def reconcile_once(kube: Kube, parent: Mapping[str, Any], observed: Sequence[Mapping[str, Any]]) -> Outcome:
    started = time.perf_counter()
    try:
        return _reconcile(kube, parent, observed)
    finally:
        metrics.RECONCILE_SECONDS.observe(time.perf_counter() - started)


def _reconcile(kube: Kube, parent: Mapping[str, Any], observed: Sequence[Mapping[str, Any]]) -> Outcome:
    meta = parent["metadata"]
    ns, name = meta["namespace"], meta["name"]
    observed = [*observed, *_key_secret(kube, parent, observed)]
    result = sync(parent, observed, parent.get("status"), at=status.now(), policy=POLICY)
    out = Outcome(ready=result.ready, invalid=result.invalid)

    current = {key(dict(o)): o for o in observed}
    made = []
    for obj in result.create:  # before the Deployments that read it
        created = _create_once(kube, parent, obj)
        current[key(obj)] = created or obj
        made += [_without_data(created)] if created else []
        metrics.WRITES.labels("create", obj["kind"]).inc()
        out.applied.append(f"{obj['kind']}/{obj['metadata']['name']}")
    if made and len(made) == len(result.create):
        # The API server answered with the new Secret's uid: the core again, with it, so that the workloads that
        # wait for the key go out in this pass rather than in the next one (a settle interval and a pass later).
        result = sync(parent, [*observed, *made], parent.get("status"), at=status.now(), policy=POLICY)
        out = Outcome(applied=out.applied, ready=result.ready, invalid=result.invalid)
    for pod in result.annotate:  # before the Deployment whose scale-in reads them
        kube.annotate_pod(pod)
        metrics.WRITES.labels("annotate", "Pod").inc()
    for pod in result.gates:  # the new KV revision's pods whose turn to be Ready has come (duplex.lockstep)
        kube.patch_pod_status(pod)
        metrics.WRITES.labels("gate", "Pod").inc()
    handovers = {key(h.workload): h for h in result.handover}
    for obj in result.apply:
        handover = handovers.get(key(obj))
        if handover and handover.before_apply:  # before the apply that drops the operator's claim on replicas
            _hand_over(kube, handover.workload)
        try:
            current[key(obj)] = kube.apply(obj)
        except ApiError as err:
            kind = kind_of(obj)
            if not (kind is not None and kind.optional and err.failure is Failure.NOT_FOUND):
                raise
            _missing_crd(kube, parent, obj)  # the rest of the pass goes on: deletes, status, Events
            continue
        if handover and not handover.before_apply:  # the workload was just created with no replicas of its own
            current[key(obj)] = _hand_over(kube, handover.workload)
        metrics.WRITES.labels("apply", obj["kind"]).inc()
        out.applied.append(f"{obj['kind']}/{obj['metadata']['name']}")
    for obj in result.delete:
        kube.delete(obj)
        current.pop(key(obj), None)
        metrics.WRITES.labels("delete", obj["kind"]).inc()
        out.deleted.append(f"{obj['kind']}/{obj['metadata']['name']}")
    if out.applied or out.deleted:
        log.info("%s/%s: applied %s; deleted %s", ns, name, out.applied or "-", out.deleted or "-")
    if result.invalid is None:
        counts = Counter(k[1] for k in current)
        for kind in CHILD_KINDS:
            metrics.MANAGED_OBJECTS.labels(ns, name, kind.kind).set(counts[kind.kind])

    if result.write_status:
        kube.patch_status(ns, name, status.patch_body(result.status))
        out.status_written = True
    for event in [*_applied_event(out), *result.events]:
        kube.post_event(dict(parent), event.type, event.reason, event.message)
    metrics.RECONCILES.labels("invalid" if result.invalid is not None else "ok").inc()
    return out


def _applied_event(out: Outcome) -> list[Event]:
    """The children this pass wrote, as the cluster took them: a child it refused is not named."""
    if not (out.applied or out.deleted):
        return []
    changes = ", ".join([*out.applied, *(f"-{ref}" for ref in out.deleted)])
    return [Event("Normal", "Applied", f"converged children: {changes}")]


def _missing_crd(kube: Kube, parent: Mapping[str, Any], obj: dict[str, Any]) -> None:
    """A child of an optional kind (its CRD is an extension's) that the cluster does not serve."""
    kind = kind_of(obj)
    assert kind is not None
    message = (
        f"{kind.kind}/{obj['metadata']['name']} was not applied: this cluster does not serve {kind.plural}."
        f"{kind.group} (install the extension's CRDs, or turn the feature off in the spec)"
    )
    log.warning("%s/%s: %s", parent["metadata"]["namespace"], parent["metadata"]["name"], message)
    kube.post_event(dict(parent), "Warning", "ExtensionMissing", message)


def _hand_over(kube: Kube, workload: dict[str, Any]) -> dict[str, Any]:
    metrics.WRITES.labels("handover", workload["kind"]).inc()
    return kube.hand_over(workload, replicas.HANDOVER)


class ForeignSecret(ApiError):
    """The engine key Secret's name is taken by a Secret this serving does not own."""


def _create_once(kube: Kube, parent: Mapping[str, Any], secret: dict[str, Any]) -> dict[str, Any] | None:
    """Create the engine key Secret with a fresh random key, and return it as stored. If the name is taken by this
    serving's own Secret (the watch had not brought it yet), it keeps its key and None is returned; if by a Secret
    of someone else's, the workloads cannot start (their pods would read a key the router does not hold): the pass
    stops with a Warning Event on the serving, and retries with backoff."""
    try:
        return kube.create(with_fresh_key(secret))
    except ApiError as err:
        if err.reason != "AlreadyExists":
            raise
    existing = kube.get(secret)
    if existing is None or owned_by(existing, parent["metadata"]["uid"]):
        return None  # gone meanwhile (the next pass creates it) or ours
    owners = ", ".join(f"{o.get('kind')}/{o.get('name')}" for o in existing["metadata"].get("ownerReferences") or [])
    whose = f"owned by {owners}" if owners else "no owner"
    message = (
        f"Secret {secret['metadata']['name']} exists and is not this serving's ({whose}): the engines and the "
        "router wait for their key. Delete or rename that Secret; the operator then creates its own."
    )
    kube.post_event(dict(parent), "Warning", "EngineKeyConflict", message)
    raise ForeignSecret(status=409, reason="AlreadyExists", message=message)


def _key_secret(kube: Kube, parent: Mapping[str, Any], observed: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The serving's engine key Secret, read by name (Secrets are never listed or watched), unless `observed` holds
    it already; without its data. Only one this serving owns counts: a stranger's of that name is left for the
    create to find (and report)."""
    meta = parent["metadata"]
    name = secret_name(meta["name"])
    if any(o.get("kind") == SECRET.kind and o["metadata"]["name"] == name for o in observed):
        return []
    stored = kube.get(SECRET.manifest({"name": name, "namespace": meta["namespace"]}))
    if stored is None or not owned_by(stored, meta["uid"]):
        return []
    return [_without_data(stored)]


def _without_data(secret: dict[str, Any]) -> dict[str, Any]:
    """What the core may see of a Secret: never its key (the watch's cache does not keep it either)."""
    return {k: v for k, v in secret.items() if k not in ("data", "stringData")}

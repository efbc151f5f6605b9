"""The reconcile workers: take a DisaggregatedServing's uid off the work queue, read the parent and its children from
the watch caches (kopf's indices; nothing here LISTs or GETs), run one pass in a thread, and requeue the uid: at
the resync interval after a pass, sooner and with backoff after a failure, never if the parent is gone."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from duplex import metrics
from duplex.apierrors import ApiError, Failure
from duplex.children.kinds import CHILD_KINDS
from duplex.kube import Kube
from duplex.reconcile import reconcile_once
from duplex.workqueue import WorkQueue

log = logging.getLogger("duplex.operator")

MAX_BACKOFF_SECONDS = 60.0
# How long the watch gets to bring back what a pass wrote before the next pass of that parent; passes sooner than
# that would see the cache without their own writes and repeat them (harmless, but a wasted request).
SETTLE_SECONDS = 0.5
# Parents reconciled at once (`duplex operator --workers`): a burst of creates is bound by the writes in flight;
# docs/benchmarks.md ("Operator benchmark") measures 4 to 16.
CONCURRENCY = 8

Cache = Mapping[str, Iterable[dict[str, Any]]]  # a kopf index: uid -> the objects stored under it


@dataclass(frozen=True)
class Caches:
    servings: Cache  # parent uid -> the parent
    children: tuple[Cache, ...]  # one per child kind: owner uid -> the children of that kind it owns
    pods: Cache = field(default_factory=dict)  # "namespace/serving" -> its engine pods (owned by ReplicaSets)

    def parent(self, uid: str) -> dict[str, Any] | None:
        return next(iter(self.servings.get(uid, ())), None)

    def observed(self, uid: str) -> list[dict[str, Any]]:
        owned = [child for index in self.children for child in index.get(uid, ())]
        parent = self.parent(uid)
        if parent is None:
            return owned
        meta = parent["metadata"]
        return owned + list(self.pods.get(f"{meta['namespace']}/{meta['name']}", ()))


def retry_delay(err: ApiError, failures: int, resync: float) -> float:
    """When to try a parent again after its pass failed for the `failures`-th time in a row."""
    backoff = min(2.0 ** (failures - 1), MAX_BACKOFF_SECONDS)
    match err.failure:
        case Failure.THROTTLED:
            return max(backoff, err.retry_after or 0.0)
        case Failure.NAMESPACE_TERMINATING | Failure.NOT_FOUND:
            return resync  # nothing to converge until the namespace, and the parent with it, is gone
        case _:
            return backoff


@dataclass
class Workers:
    queue: WorkQueue[str]
    caches: Caches
    kube: Kube
    resync_seconds: float
    _failures: dict[str, int] = field(default_factory=dict)
    _names: dict[str, tuple[str, str]] = field(default_factory=dict)  # uid -> (namespace, name), for metrics
    _threads: ThreadPoolExecutor | None = None

    async def run(self, concurrency: int = CONCURRENCY) -> None:
        # Their own threads: the loop's default pool has min(32, cores + 4), fewer than the workers can be.
        self._threads = ThreadPoolExecutor(concurrency, thread_name_prefix="reconcile")
        try:
            await asyncio.gather(*(self._work() for _ in range(concurrency)))
        finally:
            self._threads.shutdown(wait=False)

    async def _work(self) -> None:
        while True:
            uid = await self.queue.get()
            hold, again = 0.0, None
            try:
                hold, again = await self._pass(uid)
            finally:
                self.queue.done(uid, hold)
            if again is not None:
                self.queue.add(uid, again)

    async def _pass(self, uid: str) -> tuple[float, float | None]:
        """(seconds the parent's next wake-up must wait for the watch, seconds until it resyncs or retries)."""
        parent = self.caches.parent(uid)
        if parent is None:
            self._forget(uid)
            return 0.0, None
        meta = parent["metadata"]
        where = f"{meta['namespace']}/{meta['name']}"
        self._names[uid] = (meta["namespace"], meta["name"])
        metrics.SERVINGS.set(len(self.caches.servings))
        try:
            observed = self.caches.observed(uid)
            outcome = await asyncio.get_running_loop().run_in_executor(
                self._threads, reconcile_once, self.kube, parent, observed
            )
        except ApiError as err:
            failures = self._failures[uid] = self._failures.get(uid, 0) + 1
            delay = retry_delay(err, failures, self.resync_seconds)
            if err.failure in (Failure.NAMESPACE_TERMINATING, Failure.NOT_FOUND):
                log.info("%s: its namespace is going away; nothing to converge (%s)", where, err)
            elif err.failure in (Failure.TRANSIENT, Failure.THROTTLED):
                metrics.RECONCILE_ERRORS.labels("transient").inc()
                log.warning("%s: transient API error, retrying in %.0fs: %s", where, delay, err)
            else:
                metrics.RECONCILE_ERRORS.labels("unexpected").inc()
                log.error("%s: the API refused a request, retrying in %.0fs: %s", where, delay, err)
            return SETTLE_SECONDS, delay
        except Exception:  # a bug must not stop the other parents' passes
            failures = self._failures[uid] = self._failures.get(uid, 0) + 1
            delay = min(2.0 ** (failures - 1), MAX_BACKOFF_SECONDS)
            metrics.RECONCILE_ERRORS.labels("unexpected").inc()
            log.exception("%s: reconcile failed, retrying in %.0fs", where, delay)
            return SETTLE_SECONDS, delay
        self._failures.pop(uid, None)
        return (SETTLE_SECONDS if outcome.wrote else 0.0), self.resync_seconds

    def _forget(self, uid: str) -> None:
        self.queue.forget(uid)
        self._failures.pop(uid, None)
        metrics.SERVINGS.set(len(self.caches.servings))
        names = self._names.pop(uid, None)
        if names is not None:
            for kind in CHILD_KINDS:
                try:
                    metrics.MANAGED_OBJECTS.remove(*names, kind.kind)
                except KeyError:
                    pass

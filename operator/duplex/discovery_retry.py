"""A CRD created while the operator runs is watched once kopf finds its kind in the API server's discovery, which
kopf reads again on each of the CRD's watch events (kopf._core.reactor.observation). The API server adds a new group
to discovery a moment after those events, and when the last of them comes first kopf never watches the kind: seen in
CI, an InferencePool CRD installed while the operator ran (the operator kept applying a pool it could not see, and
could not delete it). For the groups of the optional kinds (children/kinds.py), a scan that lacks their kind is read
again, with backoff, until discovery lists it or RETRY_DELAYS run out (a CRD that was deleted ends there).

This wraps one function of kopf's (`kopf._cogs.clients.scanning.scan_resources`, kopf 1.45), which the observer
looks up at each call; `install` is idempotent."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection
from typing import Any

from duplex.children.kinds import CHILD_KINDS

log = logging.getLogger(__name__)
RETRY_DELAYS = (0.5, 1.0, 2.0, 4.0, 8.0)  # 15.5 s in all: discovery lagged by milliseconds to a second when seen
Scan = Callable[..., Awaitable[Collection[Any]]]


def optional_plurals() -> dict[str, frozenset[str]]:
    out: dict[str, set[str]] = {}
    for kind in CHILD_KINDS:
        if kind.optional:
            out.setdefault(kind.group, set()).add(kind.plural)
    return {group: frozenset(plurals) for group, plurals in out.items()}


def retrying(scan: Scan, wanted: dict[str, frozenset[str]], delays: Collection[float] = RETRY_DELAYS) -> Scan:
    """`scan` (kopf's scan_resources), reading discovery again while a scan of one wanted group lacks its kinds."""

    async def scan_resources(*, groups: Collection[str] | None = None, **kwargs: Any) -> Collection[Any]:
        resources = await scan(groups=groups, **kwargs)
        plurals = wanted.get(next(iter(groups))) if groups is not None and len(groups) == 1 else None
        if not plurals:
            return resources
        for delay in delays:
            if any(getattr(r, "plural", None) in plurals for r in resources):
                break
            await asyncio.sleep(delay)
            resources = await scan(groups=groups, **kwargs)
        else:
            if not any(getattr(r, "plural", None) in plurals for r in resources):
                log.info("discovery does not list %s in %s (its CRD is gone or not served)", set(plurals), groups)
        return resources

    scan_resources.duplex_retrying = True  # type: ignore[attr-defined]
    return scan_resources


def install() -> None:
    from kopf._cogs.clients import scanning

    if not getattr(scanning.scan_resources, "duplex_retrying", False):
        scanning.scan_resources = retrying(scanning.scan_resources, optional_plurals())  # type: ignore[assignment]

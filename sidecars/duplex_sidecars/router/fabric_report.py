"""The router's fabric verdict (router/fabric.py), published where the operator reads it: this pod's key in the
DisaggregatedServing's `<name>-fabric` ConfigMap, which the operator owns and the router's Role may patch (that one
object, nothing else). The operator turns the reports into the KVTransferHealthy condition.

A report is written when the verdict flips, the first transfer is measured or the canary (router/canary.py) has a
new result, and again every heartbeat, so a router that died leaves a report that ages out instead of one that
stays healthy for ever. Writes are JSON merge patches of the router's own key: routers
never overwrite each other, and the operator's server-side apply of the ConfigMap leaves keys it does not own alone.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import logging
import os
import socket
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import aiohttp

from duplex_sidecars.router.config import FabricReportConfig
from duplex_sidecars.router.endpointslices import ApiAccess
from duplex_sidecars.router.load import ROLES
from duplex_sidecars.router.periodic import Periodic

log = logging.getLogger(__name__)

# The verdict now: {"healthy": bool, "measured": bool (any read seen yet), "message": str, "backend": str,
# "canary": the canary's latest result or None}.
Verdict = Callable[[], dict[str, Any]]


def news(verdict: dict[str, Any]) -> tuple[Any, ...]:
    """What, when it changes, is written at once: the fabric's health, whether a transfer was measured yet (the first
    one turns KVTransferHealthy from Unknown to a verdict) and the canary's run."""
    canary = verdict.get("canary") or {}
    return verdict["healthy"], bool(verdict.get("measured")), canary.get("run")


def busy(verdict: dict[str, Any]) -> bool:
    """Whether the verdict's load window saw a turn or a leg in flight."""
    load = verdict.get("load") or {}
    return bool(load.get("turns")) or any((load.get(r) or {}).get("peak") not in (None, 0, 0.0) for r in ROLES)


def report_of(verdict: dict[str, Any], at: datetime.datetime) -> dict[str, Any]:
    """One router's report, as the operator parses it (duplex.status.kv_transfer)."""
    return {**verdict, "at": at.strftime("%Y-%m-%dT%H:%M:%SZ")}


def patch_body(key: str, report: dict[str, Any]) -> dict[str, Any]:
    return {"data": {key: json.dumps(report, sort_keys=True)}}


class FabricReporter:
    """Publishes `verdict()` under this pod's key: on news (a flip of `healthy`, a canary result) and every
    heartbeat."""

    def __init__(
        self, config: FabricReportConfig, verdict: Verdict, check_every: float, access: ApiAccess | None = None
    ):
        self.config = config
        self.key = os.environ.get(config.pod_name_env) or socket.gethostname()
        self._verdict = verdict
        self._check_every = min(check_every, config.heartbeat_seconds)
        self._access = access
        self._session: aiohttp.ClientSession | None = None
        self._written_at = -float("inf")  # loop time of the last write
        self._periodic = Periodic(
            "fabric report", self._publish_when_due, lambda: self._check_every, log, at_start=True
        )
        self.published: bool | None = None  # the `healthy` last written
        self._news: tuple[Any, ...] | None = None  # `news` of the verdict last written
        self.writes = 0
        self.failing = False
        self.reported_busy = False  # whether the report last written saw traffic

    def _url(self) -> str:
        assert self._access is not None
        ns, name = quote(self.config.namespace, safe=""), quote(self.config.config_map, safe="")
        return f"{self._access.base}/api/v1/namespaces/{ns}/configmaps/{name}"

    async def publish(self, verdict: dict[str, Any] | None = None) -> bool:
        """Write the current verdict now; False (logged once per outage) if the API server refused or was away."""
        verdict = self._verdict() if verdict is None else verdict
        body = patch_body(self.key, report_of(verdict, datetime.datetime.now(datetime.UTC)))
        assert self._session is not None and self._access is not None
        headers = {**self._access.headers(), "Content-Type": "application/merge-patch+json"}
        try:
            async with self._session.patch(
                self._url(), json=body, headers=headers, timeout=aiohttp.ClientTimeout(total=10)
            ) as resp:
                if resp.status >= 300:
                    raise RuntimeError(f"HTTP {resp.status}: {(await resp.text())[:300]}")
        except (aiohttp.ClientError, TimeoutError, OSError, RuntimeError) as err:
            if not self.failing:
                log.warning(
                    "fabric report to configmap %s/%s failed: %s", self.config.namespace, self.config.config_map, err
                )
            self.failing = True
            return False
        if self.failing:
            log.info("fabric report to configmap %s/%s works again", self.config.namespace, self.config.config_map)
        self.failing = False
        self.published = verdict["healthy"]
        self._news = news(verdict)
        self.reported_busy = busy(verdict)
        self.writes += 1
        return True

    async def _publish_when_due(self) -> None:
        now = asyncio.get_running_loop().time()
        verdict = self._verdict()
        fresh = news(verdict) != self._news
        since = now - self._written_at
        # While there is traffic (and once after it ends) the load goes out every load_seconds: the planner's input.
        load = (busy(verdict) or self.reported_busy) and since >= self.config.load_seconds
        if (since >= self.config.heartbeat_seconds or fresh or load or self.failing) and await self.publish(verdict):
            self._written_at = asyncio.get_running_loop().time()

    async def start(self) -> None:
        if self._access is None:
            cfg = self.config
            self._access = ApiAccess.from_kubeconfig(cfg.kubeconfig) if cfg.kubeconfig else ApiAccess.in_cluster()
        ssl = self._access.ssl_context if self._access.ssl_context is not None else True
        self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ssl))
        self._periodic.start()

    async def stop(self) -> None:
        await self._periodic.stop()
        if self._session is not None:
            await self._session.close()
            self._session = None

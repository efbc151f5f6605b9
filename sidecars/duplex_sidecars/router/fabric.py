"""What the engines' own NIXL counters say about the fabric, read by the router off their /metrics.

vLLM records a KV transfer on the engine that initiates the READ: prefill for decode's blocks read back (D->P),
decode for prefill's (P->D). Every `interval` seconds the router scrapes each engine's
`vllm:nixl_bytes_transferred` and `vllm:nixl_xfer_time_seconds` histograms and its failure and expiry counters, and
turns the deltas into the bandwidth that engine's reads got. A read engine's bandwidth is attributed to the engines
it read from in that interval (the router knows the pairs: it sent the legs). Below the backend's floor the fabric
is reported unhealthy with a message that names the likely cause (a TCP fallback moves KV at tens to hundreds of
MB/s; EFA moves GB/s), on `/ready`, in the log and in the metrics the alerts read.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from duplex_sidecars.router.endpoints import DECODE, PREFILL, Engines
from duplex_sidecars.router.metrics import RouterMetrics
from duplex_sidecars.router.periodic import Periodic

log = logging.getLogger(__name__)

BYTES = "vllm:nixl_bytes_transferred_sum"
SECONDS = "vllm:nixl_xfer_time_seconds_sum"
READS = "vllm:nixl_xfer_time_seconds_count"
FAILED = "vllm:nixl_num_failed_transfers_total"
EXPIRED = "vllm:nixl_num_kv_expired_reqs_total"
_WANTED = (BYTES, SECONDS, READS, FAILED, EXPIRED)
# Below this an engine's reads look like a TCP fallback: vLLM's NIXL docs expect > 1 GB/s on RDMA (EFA, IB) and
# > 100 MB/s on TCP.
FLOOR_GBPS = {"LIBFABRIC": 1.0, "UCX": 0.1}


def counters_of(text: str) -> dict[str, float]:
    """The NIXL sums and counters of one scrape, summed over label sets (an engine's data-parallel ranks)."""
    out: dict[str, float] = dict.fromkeys(_WANTED, 0.0)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in out:
                out[sample.name] += sample.value
    return out


@dataclass
class EngineFabric:
    """One engine's reads over the last interval with transfers."""

    url: str
    role: str
    last: dict[str, float] | None = None
    gbps: float | None = None  # bandwidth of its reads in the last interval that had any
    reads: float = 0.0
    read_bytes: float = 0.0  # average bytes per read in that interval
    failed: float = 0.0
    expired: float = 0.0
    read_from: set[str] = field(default_factory=set)  # engines whose blocks it read in that interval

    def describe(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "role": self.role,
            "read_gbps": self.gbps,
            "reads": self.reads,
            "read_bytes": self.read_bytes,
            "failed_transfers": self.failed,
            "expired_reads": self.expired,
        }


def judge(
    engines: list[EngineFabric], backend: str, floor_gbps: float | None = None, min_read_bytes: float = 0.0
) -> tuple[bool, str]:
    """Healthy, and a one-line reason: which engine reads below the floor, or fails its transfers. Reads smaller
    than `min_read_bytes` on average are latency, not bandwidth, and are not held to the floor."""
    floor = floor_gbps if floor_gbps is not None else FLOOR_GBPS.get(backend, 0.1)
    slow = [e for e in engines if e.gbps is not None and e.gbps < floor and e.read_bytes >= min_read_bytes]
    failing = [e for e in engines if e.failed and e.failed >= max(e.reads, 1) * 0.1]
    if slow:
        worst = min(slow, key=lambda e: e.gbps or 0.0)
        return False, (
            f"KV transfers at {worst.gbps:.2f} GB/s on {worst.role} {worst.url}, below the {floor:g} GB/s expected of "
            f"{backend}: TCP fallback? (check FI_PROVIDER, the EFA devices and the NIXL backend)"
        )
    if failing:
        e = failing[0]
        return False, f"{e.failed:.0f} of {e.reads + e.failed:.0f} KV transfers failed on {e.role} {e.url}"
    measured = [e.gbps for e in engines if e.gbps is not None]
    if not measured:
        return True, "no KV transfers measured yet"
    return True, f"KV transfers at {min(measured):.2f}-{max(measured):.2f} GB/s ({backend})"


class FabricWatch:
    """Scrapes every engine's NIXL counters on an interval; `pairs` are noted by the pipeline as legs go out."""

    def __init__(
        self,
        engines: Engines,
        session: aiohttp.ClientSession,
        metrics: RouterMetrics,
        backend: str,
        interval: float,
        headers: dict[str, str] | None = None,
        floor_gbps: float | None = None,
        min_read_bytes: float = 0.0,
    ):
        self._engines = engines
        self._session = session
        self._metrics = metrics
        self.backend = backend
        self.interval = interval
        self.floor_gbps = floor_gbps
        self.min_read_bytes = min_read_bytes
        self._headers = headers or {}
        self.state: dict[str, EngineFabric] = {}
        self._pairs: dict[str, set[str]] = defaultdict(set)  # initiating engine -> engines read from, this interval
        self.healthy, self.message = True, "no KV transfers measured yet"
        self._periodic = Periodic("fabric watch", self._scrape_and_tell, lambda: self.interval, log)

    def note_read(self, reader: str, owner: str) -> None:
        """A leg made `reader` read `owner`'s blocks (prefill reading decode's, or decode reading prefill's)."""
        self._pairs[reader].add(owner)

    async def _scrape(self, url: str) -> dict[str, float] | None:
        try:
            async with self._session.get(
                url + "/metrics", headers=self._headers, timeout=aiohttp.ClientTimeout(total=10)
            ) as resp:
                if resp.status != 200:
                    return None
                return counters_of(await resp.text())
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError):
            return None

    async def scrape_all(self) -> None:
        wanted = [(e.url, role) for role in (PREFILL, DECODE) for e in self._engines.pool(role).engines.values()]
        self.state = {u: s for u, s in self.state.items() if u in {w for w, _ in wanted}}
        results = await asyncio.gather(*(self._scrape(url) for url, _ in wanted))
        pairs, self._pairs = self._pairs, defaultdict(set)
        for (url, role), now in zip(wanted, results, strict=True):
            if now is None:
                continue
            engine = self.state.setdefault(url, EngineFabric(url, role))
            self._update(engine, now, pairs.get(url, set()))
        self.healthy, self.message = judge(
            list(self.state.values()), self.backend, self.floor_gbps, self.min_read_bytes
        )
        self._metrics.kv_transfer_healthy.set(1 if self.healthy else 0)

    def _update(self, engine: EngineFabric, now: dict[str, float], read_from: set[str]) -> None:
        last, engine.last = engine.last, now
        if last is None:
            # An engine's counters start at zero with it: the first scrape counts every read since it started (a
            # conversation over before the router first looked would otherwise never be measured).
            last = dict.fromkeys(now, 0.0)
        delta = {k: max(0.0, now[k] - last[k]) for k in now}  # a restarted engine starts from zero again
        engine.failed, engine.expired = delta[FAILED], delta[EXPIRED]
        if delta[FAILED]:
            self._metrics.kv_transfer_failures.labels(engine.role, engine.url).inc(delta[FAILED])
        if delta[EXPIRED]:
            self._metrics.kv_expired_reads.labels(engine.role, engine.url).inc(delta[EXPIRED])
        if delta[READS] and delta[SECONDS] > 0:
            engine.reads = delta[READS]
            engine.read_bytes = delta[BYTES] / delta[READS]
            engine.gbps = delta[BYTES] / delta[SECONDS] / 1e9
            engine.read_from = read_from
            self._metrics.kv_read_bandwidth.labels(engine.role, engine.url).set(engine.gbps * 1e9)
            for owner in read_from:
                self._metrics.kv_pair_bandwidth.labels(engine.url, owner).set(engine.gbps * 1e9)

    def verdict(self) -> dict[str, Any]:
        """What the router reports to the operator (router/fabric_report.py)."""
        measured = any(e.gbps is not None for e in self.state.values())
        return {"healthy": self.healthy, "measured": measured, "message": self.message, "backend": self.backend}

    def describe(self) -> dict[str, Any]:
        return {
            "healthy": self.healthy,
            "message": self.message,
            "backend": self.backend,
            "engines": [e.describe() for e in self.state.values()],
        }

    async def _scrape_and_tell(self) -> None:
        """One round: scrape, and say so in the log when the verdict flips."""
        started = time.monotonic()
        was = self.healthy
        await self.scrape_all()
        if was and not self.healthy:
            log.warning("fabric: %s", self.message)
        elif not was and self.healthy:
            log.info("fabric: healthy again: %s", self.message)
        log.debug("fabric scrape took %.3fs", time.monotonic() - started)

    def start(self) -> None:
        self._periodic.start()

    async def stop(self) -> None:
        await self._periodic.stop()

"""The engines the router may send legs to: one pool per role, with in-flight counts, health and the choice of engine.

Sources (static URLs, EndpointSlices) only ever call `Engines.set_role(role, urls, draining, desired)`; everything that
depends on the endpoint set changing (dropping store entries of a departed decode engine, metrics) hangs off that one
call.

A draining decode engine (its pod is terminating and waits in its preStop hook, docs/architecture.md "Draining")
stays in the pool: the next turn of a conversation bound to it still reads its blocks, but the picker gives it no new
decode leg, so the conversation binds elsewhere and the pod's hold ends. A draining prefill engine stays too, for the
case where it is the last one: the picker gives it legs only when no other prefill engine is left, and its hook holds
the pod until another serves.

During a KV-incompatible rollout the engines of two KV revisions serve side by side, and a prefill engine's blocks can
only be read by a decode engine of its own revision (and back). Each engine names its revision on its health answers
(protocol.KV_REVISION_HEADER); `Engines.target_revision` says which revision new requests go to, and a request keeps
to that one revision for both its legs.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Coroutine, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from duplex_sidecars.protocol import KV_REVISION_HEADER
from duplex_sidecars.router.metrics import RouterMetrics
from duplex_sidecars.router.periodic import Periodic

log = logging.getLogger(__name__)

PREFILL = "prefill"
DECODE = "decode"
ROLES = (PREFILL, DECODE)


def normalize_url(url: str) -> str:
    url = url.strip().rstrip("/")
    if "://" not in url:
        url = "http://" + url
    return url


@dataclass
class Engine:
    url: str
    role: str
    inflight: int = 0
    queued_seconds: float = 0.0  # the compute its legs in flight are expected to take (router/leg_costs.py)
    # Of that, what was still ahead at _backlog_at: an engine works through its legs, so a leg that has run for a
    # while counts only its remainder (backlog_seconds).
    _backlog: float = field(default=0.0, repr=False)
    _backlog_at: float = field(default=0.0, repr=False)
    healthy: bool | None = None  # None: not probed yet
    draining: bool = False  # decode: terminating; its blocks are read, it takes no new legs
    # The KV revision its health answers name: "" when they name none (an engine from before revisions), None until
    # the first answer.
    revision: str | None = None
    last_error: str | None = None
    # Decode: whether its last answer, streamed (True) or not (False), carried kv_transfer_params.
    sends_params: dict[bool, bool] = field(default_factory=dict)
    _gauge: Any = field(default=None, repr=False)

    def backlog_seconds(self, now: float | None = None) -> float:
        """The compute still ahead of a leg sent now: the expected seconds of the legs in flight less what the engine
        has worked off since they came, at a second a second (it computes one step at a time)."""
        now = time.monotonic() if now is None else now
        return max(0.0, self._backlog - (now - self._backlog_at))

    def _set_backlog(self, seconds: float, now: float) -> None:
        self._backlog, self._backlog_at = seconds, now

    def saw_params(self, stream: bool, present: bool) -> None:
        """Note whether a decode answer carried kv_transfer_params; say so in the log when an engine stops sending
        them (or never did), once per change."""
        before = self.sends_params.get(stream)
        self.sends_params[stream] = present
        if present or before is False:
            return
        if stream:
            log.warning(
                "decode engine %s sent no kv_transfer_params in a streamed answer: a turn after a streamed turn "
                "recomputes (vLLM streams the params from 0.33 on; older engines give reuse only after non-streamed "
                'turns). Counted as duplex_router_kv_reuse_misses_total{reason="stream_no_params"}.',
                self.url,
            )
        else:
            log.warning(
                "decode engine %s sent no kv_transfer_params: turns after it recompute (is bidirectional_kv_xfer "
                'set on the engine?). Counted as duplex_router_kv_reuse_misses_total{reason="no_params"}.',
                self.url,
            )

    @property
    def serving(self) -> bool:
        """Answered its last probe and takes new legs."""
        return self.healthy is True and not self.draining

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "url": self.url,
            "healthy": self.healthy,
            "draining": self.draining,
            "revision": self.revision,
            "inflight": self.inflight,
            "last_error": self.last_error,
        }
        if self.role == DECODE:
            out["kv_transfer_params"] = {
                "streamed": self.sends_params.get(True),
                "non_streamed": self.sends_params.get(False),
            }
        return out


class EnginePool:
    """The engines of one role, with their in-flight counts and health (`picker` chooses among them)."""

    def __init__(self, role: str, metrics: RouterMetrics | None = None):
        self.role = role
        self.engines: dict[str, Engine] = {}
        self._metrics = metrics

    def set_urls(self, urls: Iterable[str], draining: Iterable[str] = ()) -> list[str]:
        """Replace the set of engines (`draining` ones too, flagged); returns the URLs that left. Engines that stay
        keep their state."""
        leaving = {normalize_url(u) for u in draining}
        wanted = list(dict.fromkeys([*(normalize_url(u) for u in urls), *leaving]))
        removed = [u for u in self.engines if u not in wanted]
        for url in removed:
            engine = self.engines.pop(url)
            if self._metrics is not None:
                try:
                    self._metrics.inflight.remove(self.role, url)
                except KeyError:
                    pass
                self._metrics.forget_endpoint(url)
            engine._gauge = None
        for url in wanted:
            if url not in self.engines:
                engine = Engine(url, self.role)
                if self._metrics is not None:
                    engine._gauge = self._metrics.inflight.labels(self.role, url)
                    engine._gauge.set(0)
                self.engines[url] = engine
            engine = self.engines[url]
            if engine.draining != (url in leaving):
                engine.draining = url in leaving
                log.info("%s engine %s %s", self.role, url, "is draining" if engine.draining else "serves again")
        return removed

    def __contains__(self, url: object) -> bool:
        return url in self.engines

    def __len__(self) -> int:
        return len(self.engines)

    def get(self, url: str | None) -> Engine | None:
        return self.engines.get(url) if url else None

    def revision_of(self, url: str) -> str | None:
        """The KV revision of the engine at `url`; None when it is unknown (not probed yet, or not in the pool)."""
        engine = self.engines.get(url)
        return engine.revision if engine is not None else None

    def unhealthy_urls(self) -> frozenset[str]:
        """Engines whose probe or last leg failed (not those not probed yet)."""
        return frozenset(url for url, e in self.engines.items() if e.healthy is False)

    def healthy_count(self) -> int:
        """Healthy engines, draining ones too: when nothing else is left they still serve (and bind nothing)."""
        return sum(1 for e in self.engines.values() if e.healthy)

    def _serving(self) -> list[Engine]:
        return [e for e in self.engines.values() if e.healthy is not False and not e.draining]

    def only_draining_left(self) -> bool:
        """No engine answered its last probe and takes new legs: whatever serves now is draining."""
        return not any(e.serving for e in self.engines.values())

    def saturation(self, slots: int | None) -> float:
        """Legs in flight over what the serving engines run at once, `slots` each: 1 is full, above it legs queue
        inside the engines. NaN without `slots`; +Inf with legs in flight and no serving engine left."""
        if slots is None:
            return math.nan
        inflight = sum(e.inflight for e in self.engines.values())
        serving = len(self._serving())
        if not serving:
            return math.inf if inflight else 0.0
        return inflight / (serving * slots)

    def demand(self, slots: int | None) -> float:
        """Legs in flight in engines' worth (`slots` each): how many engines the role's current load fills, whatever
        their number. NaN without `slots`."""
        return math.nan if slots is None else sum(e.inflight for e in self.engines.values()) / slots

    def expected_wait(self) -> float:
        """The compute ahead of a leg sent now to the least loaded serving engine (0 with none)."""
        now = time.monotonic()
        return min((e.backlog_seconds(now) for e in self._serving()), default=0.0)

    @contextmanager
    def busy(self, engine: Engine, seconds: float = 0.0) -> Iterator[Engine]:
        """Count a leg, and the compute it is expected to take, against the engine while it runs."""
        now = time.monotonic()
        engine.inflight += 1
        engine.queued_seconds += seconds
        engine._set_backlog(engine.backlog_seconds(now) + seconds, now)
        if engine._gauge is not None:
            engine._gauge.inc()
        try:
            yield engine
        finally:
            now = time.monotonic()
            engine.inflight -= 1
            engine.queued_seconds = max(0.0, engine.queued_seconds - seconds)
            # what is left is at most what the legs still in flight were expected to take
            engine._set_backlog(min(engine.backlog_seconds(now), engine.queued_seconds), now)
            if engine._gauge is not None:
                engine._gauge.dec()

    def mark(self, engine: Engine, healthy: bool, error: str | None = None) -> None:
        if healthy != engine.healthy:
            log.info(
                "%s engine %s is now %s%s",
                self.role,
                engine.url,
                "healthy" if healthy else "unhealthy",
                f" ({error})" if error else "",
            )
        engine.healthy = healthy
        engine.last_error = error

    def note_revision(self, engine: Engine, revision: str) -> None:
        """Keep the KV revision the engine's last answer named; a change goes to the log."""
        if revision != engine.revision:
            log.info("%s engine %s runs KV revision %s", self.role, engine.url, revision or "(none named)")
        engine.revision = revision


class Engines:
    """Both pools plus what must happen when the endpoint set changes."""

    def __init__(self, metrics: RouterMetrics | None = None):
        self._metrics = metrics
        self.prefill = EnginePool(PREFILL, metrics)
        self.decode = EnginePool(DECODE, metrics)
        self._on_decode_removed: list[Callable[[list[str]], Coroutine[Any, Any, None]]] = []
        self._pending: set[asyncio.Task[None]] = set()
        # The revision each role's source wants new work on (the Services' label); None: no wish.
        self.desired: dict[str, str | None] = {PREFILL: None, DECODE: None}

    def pool(self, role: str) -> EnginePool:
        return self.prefill if role == PREFILL else self.decode

    def on_decode_removed(self, callback: Callable[[list[str]], Coroutine[Any, Any, None]]) -> None:
        self._on_decode_removed.append(callback)

    def set_role(
        self, role: str, urls: Iterable[str], draining: Iterable[str] = (), desired: str | None = None
    ) -> list[str]:
        """The role's endpoints: `urls` ready, `draining` terminating but still serving (a decode engine's blocks are
        still read; a prefill engine is the last resort while it is the only one). `desired`: the KV revision the
        source wants new work on (None: no wish; see `target_revision`)."""
        urls = list(urls)
        if desired != self.desired[role]:
            log.info("%s engines: the desired KV revision is now %s", role, desired)
            self.desired[role] = desired
        removed = self.pool(role).set_urls(urls, draining)
        if removed:
            log.info("%s engines left: %s", role, ", ".join(removed))
        if role == DECODE and removed:
            for callback in self._on_decode_removed:
                task = asyncio.get_running_loop().create_task(callback(removed))
                self._pending.add(task)
                task.add_done_callback(self._pending.discard)
        self.update_gauges()
        return removed

    async def settle(self) -> None:
        """Wait for the reactions to endpoint removals started so far (tests, shutdown)."""
        if self._pending:
            await asyncio.gather(*list(self._pending), return_exceptions=True)

    def update_gauges(self) -> None:
        if self._metrics is None:
            return
        for pool in (self.prefill, self.decode):
            counts = {"healthy": 0, "unhealthy": 0, "unknown": 0, "draining": 0}
            for engine in pool.engines.values():
                state = "healthy" if engine.healthy else "unknown" if engine.healthy is None else "unhealthy"
                counts["draining" if engine.draining else state] += 1
            for state, n in counts.items():
                self._metrics.endpoints.labels(pool.role, state).set(n)

    def ready(self) -> bool:
        return self.prefill.healthy_count() > 0 and self.decode.healthy_count() > 0

    def target_revision(self) -> str | None:
        """The KV revision a new request goes to, both its legs; None: any engine (no revision is known, or none can
        serve a request alone). A revision can when it has a serving engine in each role ("" is the revision of
        engines that name none). The desired one (the prefill Service's label, then the decode Service's) when it can,
        else the one with the most serving engines, ties to the first in sorted order."""
        complete = self.complete_revisions()
        if not complete:
            return None
        for wanted in (self.desired[PREFILL], self.desired[DECODE]):
            if wanted is not None and wanted in complete:
                return wanted
        return max(sorted(complete), key=lambda revision: complete[revision])

    def complete_revisions(self) -> dict[str, int]:
        """The revisions with a serving engine in each role, and how many serving engines each has."""
        counts: dict[str, list[int]] = {}
        for index, pool in enumerate((self.prefill, self.decode)):
            for engine in pool.engines.values():
                if engine.serving and engine.revision is not None:
                    counts.setdefault(engine.revision, [0, 0])[index] += 1
        return {revision: p + d for revision, (p, d) in counts.items() if p and d}

    def describe(self) -> dict[str, Any]:
        return {
            pool.role: {
                "total": len(pool),
                "healthy": pool.healthy_count(),
                "endpoints": [e.describe() for e in pool.engines.values()],
            }
            for pool in (self.prefill, self.decode)
        }


class HealthProber:
    """Probes every engine's liveness path on an interval; a failed leg marks an engine unhealthy until a probe
    succeeds again."""

    def __init__(
        self,
        engines: Engines,
        session: aiohttp.ClientSession,
        path: str,
        interval: float,
        timeout: float,
        headers: dict[str, str] | None = None,
    ):
        self._engines = engines
        self._session = session
        self.path = path
        self.interval = interval
        self.timeout = timeout
        self._headers = headers or {}
        self._wake = asyncio.Event()
        # The caller probes once before starting the loop; from then on: wait (or a poke), then probe.
        self._periodic = Periodic("health probing", self.probe_all, lambda: self.interval, log, wake=self._wake)

    def reconfigure(self, path: str, interval: float, timeout: float, headers: dict[str, str]) -> None:
        """What a config reload changes: the path, the pace, the timeout and the engine key's header."""
        self.path, self.interval, self.timeout, self._headers = path, interval, timeout, headers

    async def probe(self, pool: EnginePool, engine: Engine) -> None:
        try:
            async with self._session.get(
                engine.url + self.path,
                timeout=aiohttp.ClientTimeout(total=self.timeout),
                headers=self._headers,
            ) as resp:
                await resp.read()
                ok = resp.status == 200
                pool.note_revision(engine, resp.headers.get(KV_REVISION_HEADER, ""))
                pool.mark(engine, ok, None if ok else f"health status {resp.status}")
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            pool.mark(engine, False, f"health probe: {type(exc).__name__}: {exc}")

    async def probe_all(self) -> None:
        self._wake.clear()  # engines added from here on poke again
        jobs = [
            self.probe(pool, e)
            for pool in (self._engines.prefill, self._engines.decode)
            for e in list(pool.engines.values())
        ]
        if jobs:
            await asyncio.gather(*jobs)
        self._engines.update_gauges()

    def poke(self) -> None:
        """Probe now (new engines appeared)."""
        self._wake.set()

    def start(self) -> None:
        self._periodic.start()

    async def stop(self) -> None:
        await self._periodic.stop()

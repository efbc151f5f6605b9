"""The router process: the `Router`, which builds its long-lived parts and holds the current config generation, and
the HTTP routes (OpenAI-compatible completions, models, health, readiness, metrics, drain) it serves on its ports."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import hmac
import json
import logging
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import aiohttp.abc

from duplex_sidecars.http1.server import ClientGone, FrontServer, Limits, Request
from duplex_sidecars.router import pipeline
from duplex_sidecars.router.apis import APIS
from duplex_sidecars.router.canary import Canary
from duplex_sidecars.router.client_auth import presented_key
from duplex_sidecars.router.config import RouterConfig
from duplex_sidecars.router.config_file import ConfigError, ConfigSource
from duplex_sidecars.router.endpoints import DECODE, PREFILL, Engine, Engines, HealthProber, normalize_url
from duplex_sidecars.router.endpointslices import EndpointSliceWatcher
from duplex_sidecars.router.errors import (
    RouterError,
    Unauthorized,
    error_json,
    send_error,
    send_router_error,
)
from duplex_sidecars.router.fabric import FabricWatch
from duplex_sidecars.router.fabric_report import FabricReporter
from duplex_sidecars.router.legs import make_leg_client, make_session
from duplex_sidecars.router.live import Live, engine_api_key_of
from duplex_sidecars.router.load import LoadWindow, histogram_buckets
from duplex_sidecars.router.metrics import RouterMetrics
from duplex_sidecars.router.periodic import Periodic
from duplex_sidecars.router.store import Store, StoreError, make_store
from duplex_sidecars.router.turn import body_of, parse_turn

log = logging.getLogger(__name__)

_MAINTENANCE_SECONDS = 5.0
BINDINGS_SECONDS = 30.0  # how often live bindings per decode engine are counted for the fabric report


class Router:
    """The composition root: builds the router's long-lived parts once (metrics, engines, store, clients, the
    background loops) and holds the current config generation, `live`, which a reload replaces whole."""

    def __init__(
        self,
        config: RouterConfig,
        source: ConfigSource | None = None,
        store: Store | None = None,
        resolver: aiohttp.abc.AbstractResolver | None = None,
        span_exporter: Any = None,
    ):
        """`span_exporter`: with tracing on, an OpenTelemetry SpanExporter that takes the spans in place of the
        configured endpoint (tests)."""
        self.source = source
        self._resolver = resolver
        self.metrics = RouterMetrics()
        self.engines = Engines(self.metrics)
        self.store: Store = store or make_store(config.store, engine_api_key_of(config))  # seals Redis entries
        self.live = Live.first(config, self.engines, self.store, make_leg_client(resolver), self.metrics, span_exporter)
        self._show_store_bound()
        self.limits = Limits(
            lambda: self.config.max_body_bytes,
            admit=self.admit,
            limited=_counted,
            on_reject=lambda reason: self.metrics.rejected.labels(reason).inc(),
        )  # the API server's; a reload changes them in place
        self.apply_limits()
        # Started by `start`:
        self.session: aiohttp.ClientSession | None = None  # probes, scrapes and /v1/models (the legs have their own)
        self.prober: HealthProber | None = None
        self.fabric: FabricWatch | None = None
        self.fabric_report: FabricReporter | None = None
        self.canary: Canary | None = None
        self.watcher: EndpointSliceWatcher | None = None
        self._upkeep = Periodic(
            "store maintenance", self._store_upkeep, lambda: _MAINTENANCE_SECONDS, log, at_start=True
        )
        self._reload = Periodic(
            "config reload", self._reload_if_changed, lambda: self.config.reload_interval_seconds, log
        )
        self.engines.on_decode_removed(self._drop_departed)
        self._role_signals()
        # Each role's saturation and the TTFT p90 over the last minute, for the operator's planner (router/load.py).
        self.load = LoadWindow(
            self._saturation,
            self._demand,
            lambda: histogram_buckets(self.metrics.ttft.metric.collect(), "duplex_router_time_to_first_token_seconds"),
        )
        # Live bindings per decode engine (by host:port), counted every BINDINGS_SECONDS: the fabric report carries them
        # to the operator, which makes the decode pods holding the fewest the first to go on a scale-in.
        self.bindings: dict[str, int] = {}
        self._bindings_at = -float("inf")

    def _role_signals(self) -> None:
        """The autoscalers' gauges, computed when scraped (nothing on the request path)."""
        for role in (PREFILL, DECODE):
            pool = self.engines.pool(role)
            self.metrics.saturation.labels(role).set_function(functools.partial(self._saturation, role))
            self.metrics.expected_wait.labels(role).set_function(pool.expected_wait)

    def _slots(self, role: str) -> int | None:
        return self.config.capacity.prefill_slots if role == PREFILL else self.config.capacity.decode_slots

    def _saturation(self, role: str) -> float:
        return self.engines.pool(role).saturation(self._slots(role))

    def _demand(self, role: str) -> float:
        return self.engines.pool(role).demand(self._slots(role))

    @property
    def config(self) -> RouterConfig:
        return self.live.config

    @property
    def generation(self) -> int:
        return self.live.generation

    def _show_store_bound(self) -> None:
        bound = self.store.bytes_bound()
        if bound is not None:
            self.metrics.store_max_bytes.set(bound)

    def calibrated(self) -> dict[str, Any] | None:
        """What a computed and a read token cost, as fitted so far (router/calibration.py), or None."""
        calibration = self.live.deps.calibration
        return calibration.report() if calibration is not None else None

    def admit(self, method: str, path: str, headers: Mapping[str, str]) -> tuple[int, bytes] | None:
        """A completion's head, before its body is reserved or read: with client keys on and no key the router knows,
        the route's own 401 at once, so that an unauthenticated client holds no body (the handler checks again)."""
        api = APIS.get(path)
        keys = self.live.client_keys
        if api is None or keys is None or method != "POST":
            return None
        if keys.tenant_for(presented_key(headers.get("authorization"), headers.get("x-api-key"))) is not None:
            return None
        self.metrics.rejected.labels("unauthorized").inc()
        err = Unauthorized()
        return err.status, api.error_body(err.status, err.message, err.type, err.code)

    def apply_limits(self) -> None:
        """The client limits of the config, applied to the HTTP server (on start and on every reload)."""
        cfg = self.config.client_limits
        self.limits.max_connections = cfg.max_connections
        self.limits.max_connections_per_source = cfg.max_connections_per_source
        self.limits.max_inflight = cfg.max_inflight_requests
        self.limits.head_seconds = cfg.head_timeout_seconds
        self.limits.body_seconds = cfg.body_timeout_seconds
        self.limits.idle_seconds = cfg.idle_seconds
        self.limits.write_stall_seconds = cfg.write_stall_seconds
        self.limits.max_header_fields = cfg.max_header_fields
        self.limits.max_held_bodies = cfg.max_held_body_bytes

    # ---- lifecycle -----------------------------------------------------------------------------------------------

    async def start(self) -> None:
        self.session = make_session(self._resolver)
        hc, headers = self.config.health_check, self.live.engine_headers()
        self.prober = HealthProber(
            self.engines, self.session, hc.path, hc.interval_seconds, hc.timeout_seconds, headers
        )
        await self._use_endpoints(self.config)
        await self.prober.probe_all()  # a first answer for /ready without waiting an interval
        self.prober.start()
        fc = self.config.fabric
        self.fabric = FabricWatch(
            self.engines,
            self.session,
            self.metrics,
            fc.backend,
            fc.interval_seconds,
            headers,
            fc.floor_gbps,
            fc.min_read_bytes,
        )
        self.fabric.start()
        # From here on the request path tells the fabric watch which engines read whose blocks.
        self.live = dataclasses.replace(self.live, deps=dataclasses.replace(self.live.deps, fabric=self.fabric))
        if self.config.canary.enabled:
            self.canary = Canary(self.config.canary, lambda: self.live.deps, self._session, headers)
            self.canary.start()
        if fc.report is not None:
            self.fabric_report = FabricReporter(fc.report, self.verdict, min(fc.interval_seconds, 5.0))
            await self.fabric_report.start()
        self._upkeep.start()
        if self.source is not None and self.source.path is not None:
            self._reload.start()

    def verdict(self) -> dict[str, Any]:
        """What the fabric report tells the operator: the fabric watch's verdict, the canary's latest result and the
        calibration."""
        assert self.fabric is not None
        canary = self.canary.verdict() if self.canary is not None else None
        verdict = {**self.fabric.verdict(), "canary": canary, "calibration": self.calibrated()}
        self.load.sample()
        return {**verdict, "bindings": dict(self.bindings), "load": self.load.summary()}

    def _session(self) -> aiohttp.ClientSession:
        assert self.session is not None
        return self.session

    async def stop(self) -> None:
        await self._reload.stop()
        await self._upkeep.stop()
        if self.canary is not None:
            await self.canary.stop()
        if self.prober is not None:
            await self.prober.stop()
        if self.fabric_report is not None:
            await self.fabric_report.stop()
        if self.fabric is not None:
            await self.fabric.stop()
        if self.watcher is not None:
            await self.watcher.stop()
            self.watcher = None
        await self.engines.settle()
        await self.store.close()
        await self.live.deps.client.close()
        if self.session is not None:
            await self.session.close()
        tracer = self.live.deps.tracer
        if tracer is not None:
            await asyncio.to_thread(tracer.shutdown)  # the spans still queued go out, within a bounded wait

    # ---- endpoints -----------------------------------------------------------------------------------------------

    def _on_discovered(
        self, role: str, urls: list[str], draining: Sequence[str] = (), desired: str | None = None
    ) -> None:
        before = set(self.engines.pool(role).engines)
        self.engines.set_role(role, urls, draining, desired)
        if self.prober is not None and set(urls) - before:
            self.prober.poke()

    async def _use_endpoints(self, config: RouterConfig) -> None:
        old = self.watcher.discovery if self.watcher is not None else None
        if config.discovery is not None:
            if config.discovery == old:
                return
            if self.watcher is not None:
                await self.watcher.stop()
                self.watcher = None  # a new one that fails to start leaves none, so that the next reload starts one
            if config.prefill or config.decode:
                log.warning("discovery is configured: the static prefill/decode lists are ignored")
            self.watcher = EndpointSliceWatcher(config.discovery, self._on_discovered)
            await self.watcher.start()
            return
        if self.watcher is not None:
            await self.watcher.stop()
            self.watcher = None
        self._on_discovered(PREFILL, config.prefill)
        self._on_discovered(DECODE, config.decode)

    async def _drop_departed(self, urls: list[str]) -> None:
        for url in urls:
            try:
                dropped = await self.store.drop_endpoint(url)
            except StoreError:
                self.metrics.store_errors.labels("drop_endpoint").inc()
                continue
            if dropped:
                log.info("dropped %d stored conversation(s) held by departed decode engine %s", dropped, url)
                self.metrics.store_dropped.inc(dropped)

    # ---- config reload -------------------------------------------------------------------------------------------

    async def apply(self, new: RouterConfig) -> None:
        """Switch to a new config without dropping traffic. Listening address and store backend need a restart."""
        warn_of_restart(self.config, new)
        self.store.set_bounds(new.store.max_entries, new.store.max_bytes)
        self._show_store_bound()
        old_tracer = self.live.deps.tracer
        self.live = self.live.reloaded(new)
        if self.prober is not None:
            hc = new.health_check
            self.prober.reconfigure(hc.path, hc.interval_seconds, hc.timeout_seconds, self.live.engine_headers())
        self.apply_limits()
        await self._use_endpoints(new)
        if old_tracer is not None and old_tracer is not self.live.deps.tracer:
            # New tracing settings: the old tracer's queued spans go out. Requests in flight keep the old
            # generation, and their spans that end from here on are dropped.
            await asyncio.to_thread(old_tracer.shutdown)

    async def _reload_if_changed(self) -> None:
        """One round of the reload loop: the client keys, then the config file. Neither part's failure stops the
        other, and a change that failed to apply is applied again next round: a failure must never leave a revoked
        key valid or a change unapplied for good."""
        assert self.source is not None
        keys = self.live.client_keys
        if keys is not None:
            try:
                keys.refresh()  # a mounted Secret changes in place
            except Exception:
                log.exception("client keys: refresh failed; trying again in %gs", self.config.reload_interval_seconds)
        try:
            if not self.source.changed():
                return
            new = self.source.load()
        except ConfigError as exc:
            self.metrics.config_reloads.labels("invalid").inc()
            log.error("config reload: keeping the current config: %s", exc)
            return
        except Exception:
            self.metrics.config_reloads.labels("invalid").inc()
            log.exception("config reload failed; keeping the current config")
            return
        try:
            await self.apply(new)
        except Exception:
            self.source.forget()  # so that the next round loads and applies the file again
            self.metrics.config_reloads.labels("failed").inc()
            log.exception("config reload: applying the new config failed; trying again next round")
            return
        self.metrics.config_reloads.labels("applied").inc()
        log.info("config reloaded (generation %d)", self.generation)

    async def count_bindings(self) -> dict[str, int]:
        """Live bindings per decode engine, by address (host:port, as the engine's URL has it); an engine the store did
        not answer for keeps its last count."""
        counts = {}
        for url in list(self.engines.decode.engines):
            host = urllib.parse.urlsplit(url).netloc or url
            try:
                counts[host] = await self.store.held(url)
            except StoreError:
                self.metrics.store_errors.labels("held").inc()
                if host in self.bindings:
                    counts[host] = self.bindings[host]
        self.bindings = counts
        return counts

    async def _store_upkeep(self) -> None:
        now = time.monotonic()
        if self.fabric_report is not None and now - self._bindings_at >= BINDINGS_SECONDS:
            self._bindings_at = now
            await self.count_bindings()
        await self.store.upkeep()
        size = await self.store.size()
        if size is not None:
            self.metrics.store_entries.set(size)
        held = self.store.bytes_held()
        if held is not None:
            self.metrics.store_bytes.set(held)


def warn_of_restart(old: RouterConfig, new: RouterConfig) -> None:
    """Say which of a reload's changes wait for a restart: they are not applied."""
    if (new.host, new.port, new.admin_port) != (old.host, old.port, old.admin_port):
        log.warning("config: host and port changes take effect after a restart")
    bounds = {"max_entries", "max_bytes"}
    if new.store.model_dump(exclude=bounds) != old.store.model_dump(exclude=bounds):
        log.warning("config: store backend changes take effect after a restart")
    if new.fabric != old.fabric:
        log.warning("config: fabric watch changes take effect after a restart")
    if new.canary != old.canary:
        log.warning("config: canary changes take effect after a restart")


# ---- HTTP -----------------------------------------------------------------------------------------------------------

Route = Callable[[Router, Request], Awaitable[None]]


async def _completions(router: Router, request: Request) -> None:
    api = APIS[request.path]
    route = api.route
    status = 500
    now = router.live  # one generation for the whole request
    tracer = now.deps.tracer
    trace = tracer.request(request, route) if tracer is not None else None
    try:
        client = authenticated(router, request)
        raw = body_of(request, now.config.max_body_bytes)
        config = now.config
        turn = parse_turn(
            request, raw, config.conversation, config.served_model_names, client, config.gateway, config.receipts
        )
        if trace is not None:
            trace.parsed(turn)
        status = await pipeline.handle(now.deps, request, turn, trace)
    except RouterError as exc:
        status = exc.status
        send_router_error(request, exc, api.error_body)
    except ClientGone:
        status = 499
        log.info("client went away during %s", request.path)
        raise
    finally:
        router.metrics.requests.labels(route, str(status)).inc()
        if trace is not None:
            trace.end(status)


def authenticated(router: Router, request: Request) -> str | None:
    """The tenant of the request's API key when the router checks keys (Unauthorized without a known one)."""
    keys = router.live.client_keys
    if keys is None:
        return None
    tenant = keys.tenant_for(presented_key(request.header("authorization"), request.header("x-api-key")))
    if tenant is None:
        router.metrics.rejected.labels("unauthorized").inc()
        raise Unauthorized()
    return tenant


async def _models(router: Router, request: Request) -> None:
    authenticated(router, request)
    now = router.live
    names = now.config.served_model_names
    if names:
        data = [{"id": n, "object": "model", "created": 0, "owned_by": "duplex"} for n in names]
        request.respond(200, json.dumps({"object": "list", "data": data}).encode())
        return
    pickers = now.deps.pickers
    engine = pickers[DECODE].pick(router.engines.decode) or pickers[PREFILL].pick(router.engines.prefill)
    if engine is None or router.session is None:
        send_error(request, 503, "No engines are available to list models.", "service_unavailable", 503)
        return
    try:
        async with router.session.get(
            engine.url + "/v1/models",
            headers=now.engine_headers(),
            timeout=aiohttp.ClientTimeout(total=now.config.timeouts.connect_seconds + 5),
        ) as resp:
            body = await resp.read()
            if resp.status != 200:
                send_error(request, 502, f"Engine answered /v1/models with HTTP {resp.status}.", "bad_gateway", 502)
                return
    except (TimeoutError, aiohttp.ClientError, OSError):
        send_error(request, 503, "No engine answered /v1/models.", "service_unavailable", 503)
        return
    request.respond(200, body)


async def _health(router: Router, request: Request) -> None:
    request.respond(200, b'{"status": "ok"}')


async def _ready_bare(router: Router, request: Request) -> None:
    """/ready for API clients and kubelet: whether the router can serve, and nothing of what stands behind it."""
    ready = router.engines.ready()
    request.respond(200 if ready else 503, json.dumps({"ready": ready}).encode())


async def _ready(router: Router, request: Request) -> None:
    """/ready for operators: engines and their URLs and KV revisions, store, fabric, canary, calibration, placement
    rates, the config generation and where its traces go."""
    ready = router.engines.ready()
    now = router.live
    body = {
        "ready": ready,
        **router.engines.describe(),
        "kv_revision": {"target": router.engines.target_revision(), "desired": dict(router.engines.desired)},
        "store": router.store.health(),
        "fabric": router.fabric.describe() if router.fabric is not None else None,
        "canary": router.canary.verdict() if router.canary is not None else None,
        "calibration": router.calibrated(),
        "placement": {"prefill": now.config.placement.prefill, **now.leg_costs.describe()},
        "config_generation": now.generation,
        "traces_to": now.config.tracing.endpoint,  # the collector this generation exports to (None: tracing off)
    }
    if router.watcher is not None:
        body["discovery"] = {"synced": dict(router.watcher.synced)}
    request.respond(200 if ready else 503, json.dumps(body).encode())


async def _drain(router: Router, request: Request) -> None:
    """What an engine pod's preStop hook waits on (operator/duplex/children/duplex_drain.py): whether this router sees
    the engine at `?endpoint=` as draining and its legs in flight; for a prefill engine, whether another serves
    (`prefill_drain`); for a decode engine, the live bindings it still holds, and with `&active=<seconds>`
    the bindings stored within that many seconds: the conversations still going (older ones are taken as finished).
    An engine of a KV revision that new requests no longer go to is `retired`: no prefill engine of its revision takes
    new work, so none reads its bindings again, and it holds none. Engines prove themselves with the engine key when
    the router has one."""
    key = router.live.deps.engine_api_key
    presented = presented_key(request.headers.get("authorization"), None) or ""
    if key and not hmac.compare_digest(presented.encode(), key.encode()):
        send_error(request, 401, "The engine key is required.", code="invalid_api_key")
        return
    query = dict(urllib.parse.parse_qsl(request.query))
    url = query.get("endpoint", "")
    try:
        active = float(query["active"]) if "active" in query else None
    except ValueError:
        active = -1.0
    if not url or (active is not None and not 0 <= active <= 86_400):
        send_error(
            request,
            400,
            "Name the engine, and for a decode engine optionally the seconds a binding counts as active: "
            "/drain?endpoint=http://<pod-ip>:<port>&active=<seconds>.",
            code="bad_request",
        )
        return
    url = normalize_url(url)
    prefill = router.engines.prefill.get(url)
    if prefill is not None:
        request.respond(200, json.dumps(prefill_drain(router.engines, prefill)).encode())
        return
    engine = router.engines.decode.get(url)
    ttl = router.config.conversation.ttl_seconds
    body: dict[str, Any] = {
        "endpoint": url,
        "known": engine is not None,
        "draining": bool(engine and engine.draining),
        "inflight": engine.inflight if engine is not None else 0,
    }
    retired = retired_revision(router.engines, engine)
    if retired is not None:
        body.update(held=0, revision=retired, retired=True)
        if active is not None:
            body["active"] = 0
        request.respond(200, json.dumps(body).encode())
        return
    try:
        body["held"] = await router.store.held(url)
        if active is not None:
            body["active"] = await router.store.held(url, remaining=max(0.0, ttl - active))
    except StoreError:
        router.metrics.store_errors.labels("held").inc()
        body["held"] = body["active"] = None  # unknown: the hook keeps waiting
    request.respond(200, json.dumps(body).encode())


def prefill_drain(engines: Engines, engine: Engine) -> dict[str, Any]:
    """A terminating prefill engine is held (`held` 1) while no other prefill engine of the revision new requests go
    to serves: until then it is the last resort for every turn."""
    target = engines.target_revision()
    others = sum(
        1 for e in engines.prefill.engines.values() if e is not engine and e.serving and target in (None, e.revision)
    )
    return {
        "endpoint": engine.url,
        "known": True,
        "role": PREFILL,
        "draining": engine.draining,
        "inflight": engine.inflight,
        "others": others,
        "held": 0 if others else 1,
    }


def retired_revision(engines: Engines, engine: Engine | None) -> str | None:
    """The decode engine's KV revision when it is known and not the one new requests go to (None otherwise)."""
    target = engines.target_revision()
    if engine is None or engine.revision is None or target is None or engine.revision == target:
        return None
    return engine.revision


async def _metrics(router: Router, request: Request) -> None:
    router.engines.update_gauges()
    body, content_type = router.metrics.render(request.headers.get("accept", ""))
    request.respond(200, body, content_type)


Routes = dict[str, dict[str, Route]]

API_ROUTES: Routes = {
    **{path: {"POST": _completions} for path in APIS},
    "/v1/models": {"GET": _models},
    "/health": {"GET": _health},
    "/ready": {"GET": _ready_bare},
}
# What would tell a client the topology (engine URLs and counts, per-engine metrics, placement rates): served on the
# admin port when there is one, else on the API port too (local runs).
ADMIN_ROUTES: Routes = {
    "/health": {"GET": _health},
    "/ready": {"GET": _ready},
    "/metrics": {"GET": _metrics},
    "/drain": {"GET": _drain},
}


def route_tables(config: RouterConfig) -> tuple[Routes, Routes | None]:
    """The API port's routes and the admin port's (None: no admin port)."""
    if config.admin_port is None:
        return {**API_ROUTES, **ADMIN_ROUTES}, None
    return API_ROUTES, ADMIN_ROUTES


class Dispatch:
    """Requests to routes; unknown paths are 404 and other methods 405, as OpenAI-style errors."""

    def __init__(self, router: Router, routes: Routes):
        self.router = router
        self.routes = routes

    async def __call__(self, request: Request) -> None:
        methods = self.routes.get(request.path)
        if methods is None:
            send_error(request, 404, f"No route {request.method} {request.path}.", code="not_found")
            return
        route = methods.get("GET" if request.method == "HEAD" else request.method)
        if route is None:
            send_error(
                request,
                405,
                f"Method {request.method} is not allowed on {request.path}.",
                code="method_not_allowed",
                headers={"Allow": ", ".join(methods)},
            )
            return
        try:
            await route(self.router, request)
        except RouterError as exc:
            send_router_error(request, exc)


def _front_error(status: int, message: str) -> bytes:
    """The body of an error the HTTP layer answers itself (unparseable request, head or body too large, ...)."""
    return error_json(status, message, "invalid_request_error" if status < 500 else "server_error", status)


def _counted(method: str, path: str) -> bool:
    """The requests the in-flight cap counts: completions, not probes or metrics."""
    return path in APIS


def admin_limits() -> Limits:
    """The admin port's: GETs from a scraper or an operator, so small bodies and few connections."""
    return Limits(lambda: 64 * 1024, max_connections=64, max_inflight=16)


@dataclass
class Listeners:
    """The API server and, when configured, the admin server; `port` is the API's."""

    api: Any  # a FrontServer, or what `serve` was given in its place
    admin: FrontServer | None = None

    @property
    def port(self) -> int:
        return int(self.api.port)

    @property
    def admin_port(self) -> int | None:
        return self.admin.port if self.admin is not None else None

    async def stop(self, grace: float) -> None:
        await self.api.stop(grace)
        if self.admin is not None:
            await self.admin.stop(1.0)


async def serve(router: Router, host: str, port: int, server_class: type[Any] = FrontServer) -> Listeners:
    """Start the router's background work, then listen on the API port and the admin port (config.admin_port, 0 for
    a free one); `shutdown` undoes it all. `server_class` is the API's HTTP server (anything with FrontServer's
    constructor, `start`, `port` and `stop`: the benchmark compares uvicorn's)."""
    api_routes, admin_routes = route_tables(router.config)
    admin_port = router.config.admin_port
    await router.start()
    listeners = Listeners(server_class(Dispatch(router, api_routes), router.limits, _front_error))
    try:
        await listeners.api.start(host, port)
        if admin_routes is not None and admin_port is not None:
            listeners.admin = FrontServer(Dispatch(router, admin_routes), admin_limits(), _front_error)
            await listeners.admin.start(host, admin_port)
    except BaseException:
        await listeners.stop(1.0)
        await router.stop()
        raise
    return listeners


async def shutdown(server: Listeners, router: Router, grace: float = 10.0) -> None:
    await server.stop(grace)
    await router.stop()


class RouterServer:
    """A router serving on an address (a free loopback port by default), for tests and embedding."""

    def __init__(self, router: Router, host: str = "127.0.0.1", port: int = 0, server_class: type[Any] = FrontServer):
        self.router = router
        self.host = host
        self.port = port
        self.server_class = server_class
        self.server: Listeners | None = None

    async def start(self) -> RouterServer:
        self.server = await serve(self.router, self.host, self.port, self.server_class)
        self.port = self.server.port
        return self

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def admin_url(self) -> str:
        """Where /metrics and /ready's detail are: the admin port, or the API port when there is none."""
        admin = self.server.admin_port if self.server is not None else None
        return f"http://{self.host}:{admin}" if admin is not None else self.url

    async def close(self) -> None:
        if self.server is not None:
            server, self.server = self.server, None
            await shutdown(server, self.router)

"""The router process: its long-lived parts (config, engines, store, HTTP clients, metrics) and the HTTP routes
(OpenAI-compatible completions, models, health, readiness, metrics) served by `front`."""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import aiohttp.abc
from prometheus_client import CONTENT_TYPE_LATEST

from duplex_sidecars.http1.client import EngineClient
from duplex_sidecars.http1.server import ClientGone, FrontServer, Limits, Request
from duplex_sidecars.router import pipeline
from duplex_sidecars.router.apis import APIS
from duplex_sidecars.router.calibration import Calibration
from duplex_sidecars.router.canary import Canary
from duplex_sidecars.router.client_auth import ClientKeys, presented_key
from duplex_sidecars.router.config import RouterConfig
from duplex_sidecars.router.config_file import ConfigError, ConfigSource
from duplex_sidecars.router.endpoints import DECODE, PREFILL, Engines, HealthProber
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
from duplex_sidecars.router.leg_costs import LegCosts
from duplex_sidecars.router.legs import make_engine_client, make_session
from duplex_sidecars.router.metrics import RouterMetrics
from duplex_sidecars.router.picker import decode_picker, prefill_picker
from duplex_sidecars.router.store import (
    MemoryStore,
    RedisStore,
    Store,
    StoreError,
    make_store,
)
from duplex_sidecars.router.turn import body_of, parse_turn
from duplex_sidecars.tasks import cancel_all

log = logging.getLogger(__name__)

_MAINTENANCE_SECONDS = 5.0


class Router:
    """Everything a request needs, swapped in place when the config file changes."""

    def __init__(
        self,
        config: RouterConfig,
        source: ConfigSource | None = None,
        store: Store | None = None,
        resolver: aiohttp.abc.AbstractResolver | None = None,
    ):
        self.config = config
        self._resolver = resolver
        self.source = source
        self.metrics = RouterMetrics()
        self.engines = Engines(self.metrics)
        self.store: Store = store or make_store(config.store)
        self.session: aiohttp.ClientSession | None = None  # probes and /v1/models
        self.engine_client: EngineClient = make_engine_client(resolver)  # the legs
        self.prober: HealthProber | None = None
        self.fabric: FabricWatch | None = None
        self.fabric_report: FabricReporter | None = None
        self.canary: Canary | None = None
        self.calibration = self._calibration(config)
        self.watcher: EndpointSliceWatcher | None = None
        self.leg_costs = LegCosts(config.placement, self.calibration)
        self.pickers = {PREFILL: prefill_picker(config.placement, self.leg_costs.rates), DECODE: decode_picker()}
        self.client_keys = ClientKeys(config.client_keys_dir) if config.client_keys_dir else None
        self._show_store_bound()
        self.engine_api_key = self._api_key(config)
        self.deps = self._deps()
        self.generation = 1  # config generation, reported by /ready
        self.limits: Limits | None = None  # the HTTP server's, once serving
        self._tasks: list[asyncio.Task[None]] = []
        self.engines.on_decode_removed(self._drop_departed)

    def _show_store_bound(self) -> None:
        if isinstance(self.store, MemoryStore):
            self.metrics.store_max_bytes.set(self.store.max_bytes)

    def _deps(self) -> pipeline.Deps:
        """What the request path gets: built again whenever the config changes, so a request sees one config."""
        return pipeline.Deps(
            config=self.config,
            engines=self.engines,
            pickers=self.pickers,
            store=self.store,
            client=self.engine_client,
            metrics=self.metrics,
            engine_api_key=self.engine_api_key,
            fabric=self.fabric,
            calibration=self.calibration,
            # Only the cost placement reads what a leg is expected to compute: the other policies skip the estimate.
            leg_costs=self.leg_costs if self.config.placement.prefill == "cost" else None,
        )

    @staticmethod
    def _calibration(config: RouterConfig) -> Calibration | None:
        r = config.reuse
        return Calibration(r.calibration_window, r.calibration_min_samples) if r.calibrate else None

    def calibrated(self) -> dict[str, Any] | None:
        """What a computed and a read token cost, as fitted so far (router/calibration.py), or None."""
        return self.calibration.report() if self.calibration is not None else None

    def apply_limits(self) -> None:
        """The client limits of the config, applied to the HTTP server (on start and on every reload)."""
        if self.limits is None:
            return
        cfg = self.config.client_limits
        self.limits.max_connections = cfg.max_connections
        self.limits.max_inflight = cfg.max_inflight_requests
        self.limits.head_seconds = cfg.head_timeout_seconds
        self.limits.body_seconds = cfg.body_timeout_seconds
        self.limits.idle_seconds = cfg.idle_seconds

    @staticmethod
    def _api_key(config: RouterConfig) -> str | None:
        return os.environ.get(config.engine_api_key_env) if config.engine_api_key_env else None

    # ---- lifecycle -----------------------------------------------------------------------------------------------

    async def start(self) -> None:
        self.session = make_session(self._resolver)
        hc = self.config.health_check
        self.prober = HealthProber(
            self.engines, self.session, hc.path, hc.interval_seconds, hc.timeout_seconds, self._probe_headers()
        )
        await self._use_endpoints(self.config)
        await self.prober.probe_all()  # a first answer for /ready without waiting an interval
        self.prober.start()
        fc = self.config.fabric
        self.fabric = FabricWatch(self.engines, self.session, self.metrics, fc.backend, fc.interval_seconds,
                                  self._probe_headers(), fc.floor_gbps, fc.min_read_bytes)  # fmt: skip
        self.fabric.start()
        self.deps = self._deps()
        if self.config.canary.enabled:
            self.canary = Canary(self.config.canary, lambda: self.deps, self._session, self._probe_headers())
            self.canary.start()
        if fc.report is not None:
            self.fabric_report = FabricReporter(fc.report, self.verdict, min(fc.interval_seconds, 5.0))
            await self.fabric_report.start()
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._maintenance()))
        if self.source is not None and self.source.path is not None:
            self._tasks.append(loop.create_task(self._watch_config()))

    def verdict(self) -> dict[str, Any]:
        """What the fabric report tells the operator: the fabric watch's verdict, the canary's latest result and the
        calibration."""
        assert self.fabric is not None
        canary = self.canary.verdict() if self.canary is not None else None
        return {**self.fabric.verdict(), "canary": canary, "calibration": self.calibrated()}

    def _session(self) -> aiohttp.ClientSession:
        assert self.session is not None
        return self.session

    async def stop(self) -> None:
        await cancel_all(self._tasks)
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
        await self.engine_client.close()
        if self.session is not None:
            await self.session.close()

    def _probe_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.engine_api_key}"} if self.engine_api_key else {}

    # ---- endpoints -----------------------------------------------------------------------------------------------

    def _on_discovered(self, role: str, urls: list[str]) -> None:
        before = set(self.engines.pool(role).engines)
        self.engines.set_role(role, urls)
        if self.prober is not None and set(urls) - before:
            self.prober.poke()

    async def _use_endpoints(self, config: RouterConfig) -> None:
        old = self.watcher.discovery if self.watcher is not None else None
        if config.discovery is not None:
            if config.discovery == old:
                return
            if self.watcher is not None:
                await self.watcher.stop()
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
        old = self.config
        if (new.host, new.port, new.admin_port) != (old.host, old.port, old.admin_port):
            log.warning("config: host and port changes take effect after a restart")
        bounds = {"max_entries", "max_bytes"}
        if new.store.model_dump(exclude=bounds) != old.store.model_dump(exclude=bounds):
            log.warning("config: store backend changes take effect after a restart")
        if isinstance(self.store, MemoryStore):
            # Lower bounds evict the oldest entries at the next put or maintenance pass.
            self.store.max_entries = new.store.max_entries
            self.store.max_bytes = new.store.max_bytes
            self._show_store_bound()
        if new.fabric != old.fabric:
            log.warning("config: fabric watch changes take effect after a restart")
        if new.canary != old.canary:
            log.warning("config: canary changes take effect after a restart")
        self.engine_api_key = self._api_key(new)
        if new.client_keys_dir != old.client_keys_dir:
            self.client_keys = ClientKeys(new.client_keys_dir) if new.client_keys_dir else None
        if self.prober is not None:
            hc = new.health_check
            self.prober.path, self.prober.interval, self.prober.timeout = (
                hc.path,
                hc.interval_seconds,
                hc.timeout_seconds,
            )
            self.prober._headers = self._probe_headers()
        recalibrate = new.reuse.model_dump(exclude={"min_tokens"}) != old.reuse.model_dump(exclude={"min_tokens"})
        if recalibrate:
            self.calibration = self._calibration(new)  # a new window starts empty
        if recalibrate or new.placement != old.placement:
            self.leg_costs = LegCosts(new.placement, self.calibration)
            self.pickers = {PREFILL: prefill_picker(new.placement, self.leg_costs.rates), DECODE: self.pickers[DECODE]}
        self.config = new
        self.deps = self._deps()
        self.apply_limits()
        self.generation += 1
        await self._use_endpoints(new)

    async def _watch_config(self) -> None:
        assert self.source is not None
        while True:
            await asyncio.sleep(self.config.reload_interval_seconds)
            if self.client_keys is not None:
                self.client_keys.refresh()  # a mounted Secret changes in place
            try:
                if not self.source.changed():
                    continue
                new = self.source.load()
            except ConfigError as exc:
                self.metrics.config_reloads.labels("invalid").inc()
                log.error("config reload: keeping the current config: %s", exc)
                continue
            except Exception:
                self.metrics.config_reloads.labels("invalid").inc()
                log.exception("config reload failed; keeping the current config")
                continue
            await self.apply(new)
            self.metrics.config_reloads.labels("applied").inc()
            log.info("config reloaded (generation %d)", self.generation)

    async def _maintenance(self) -> None:
        while True:
            try:
                if isinstance(self.store, MemoryStore):
                    await self.store.sweep()
                elif isinstance(self.store, RedisStore):
                    await self.store.ping()
                size = await self.store.size()
                if size is not None:
                    self.metrics.store_entries.set(size)
                held = self.store.bytes_held()
                if held is not None:
                    self.metrics.store_bytes.set(held)
            except Exception:
                log.exception("store maintenance failed")
            await asyncio.sleep(_MAINTENANCE_SECONDS)


# ---- HTTP -----------------------------------------------------------------------------------------------------------

Route = Callable[[Router, Request], Awaitable[None]]


async def _completions(router: Router, request: Request) -> None:
    api = APIS[request.path]
    route = api.route
    status = 500
    try:
        client = authenticated(router, request)
        raw = body_of(request, router.config.max_body_bytes)
        turn = parse_turn(request, raw, router.config.conversation, router.config.served_model_names, client)
        status = await pipeline.handle(router.deps, request, turn)
    except RouterError as exc:
        status = exc.status
        send_router_error(request, exc, api.error_body)
    except ClientGone:
        status = 499
        log.info("client went away during %s", request.path)
        raise
    finally:
        router.metrics.requests.labels(route, str(status)).inc()


def authenticated(router: Router, request: Request) -> str | None:
    """The tenant of the request's API key when the router checks keys (Unauthorized without a known one)."""
    if router.client_keys is None:
        return None
    tenant = router.client_keys.tenant_for(presented_key(request.header("authorization"), request.header("x-api-key")))
    if tenant is None:
        router.metrics.rejected.labels("unauthorized").inc()
        raise Unauthorized()
    return tenant


async def _models(router: Router, request: Request) -> None:
    authenticated(router, request)
    names = router.config.served_model_names
    if names:
        data = [{"id": n, "object": "model", "created": 0, "owned_by": "duplex"} for n in names]
        request.respond(200, json.dumps({"object": "list", "data": data}).encode())
        return
    engine = router.pickers[DECODE].pick(router.engines.decode) or router.pickers[PREFILL].pick(router.engines.prefill)
    if engine is None or router.session is None:
        send_error(request, 503, "No engines are available to list models.", "service_unavailable", 503)
        return
    try:
        async with router.session.get(
            engine.url + "/v1/models",
            headers=router._probe_headers(),
            timeout=aiohttp.ClientTimeout(total=router.config.timeouts.connect_seconds + 5),
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
    """/ready for operators: engines and their URLs, store, fabric, canary, calibration, placement rates."""
    ready = router.engines.ready()
    body = {
        "ready": ready,
        **router.engines.describe(),
        "store": router.store.health(),
        "fabric": router.fabric.describe() if router.fabric is not None else None,
        "canary": router.canary.verdict() if router.canary is not None else None,
        "calibration": router.calibrated(),
        "placement": {"prefill": router.config.placement.prefill, **router.leg_costs.describe()},
        "config_generation": router.generation,
    }
    if router.watcher is not None:
        body["discovery"] = {"synced": dict(router.watcher.synced)}
    request.respond(200 if ready else 503, json.dumps(body).encode())


async def _metrics(router: Router, request: Request) -> None:
    router.engines.update_gauges()
    request.respond(200, router.metrics.render(), CONTENT_TYPE_LATEST)


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


def client_limits(router: Router) -> Limits:
    limits = Limits(
        lambda: router.config.max_body_bytes,
        limited=_counted,
        on_reject=lambda reason: router.metrics.rejected.labels(reason).inc(),
    )
    router.limits = limits
    router.apply_limits()
    return limits


def admin_limits() -> Limits:
    """The admin port's: GETs from a scraper or an operator, so small bodies and few connections."""
    return Limits(lambda: 64 * 1024, max_connections=64, max_inflight=16)


@dataclass
class Listeners:
    """The API server and, when configured, the admin server; `port` is the API's."""

    api: Any
    admin: Any = None

    @property
    def port(self) -> int:
        return int(self.api.port)

    @property
    def admin_port(self) -> int | None:
        return int(self.admin.port) if self.admin is not None else None

    async def stop(self, grace: float) -> None:
        await self.api.stop(grace)
        if self.admin is not None:
            await self.admin.stop(1.0)


async def serve(router: Router, host: str, port: int, server_class: type[Any] = FrontServer) -> Listeners:
    """Start the router's background work, then listen on the API port and the admin port (config.admin_port, 0 for
    a free one); `shutdown` undoes it all. `server_class` is the API's HTTP server (anything with FrontServer's
    constructor, `start`, `port` and `stop`: the benchmark compares uvicorn's)."""
    api_routes, admin_routes = route_tables(router.config)
    await router.start()
    listeners = Listeners(server_class(Dispatch(router, api_routes), client_limits(router), _front_error))
    try:
        await listeners.api.start(host, port)
        if admin_routes is not None:
            listeners.admin = FrontServer(Dispatch(router, admin_routes), admin_limits(), _front_error)
            await listeners.admin.start(host, router.config.admin_port)
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
        self.server: Any = None

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

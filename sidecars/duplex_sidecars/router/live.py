"""What one config generation decides, frozen: the request path's dependencies (`pipeline.Deps`), the placement
costs, the client keys and the tracer. A reload builds the next generation from the new config and the router swaps
it in whole, so a request (and /ready) reads one generation throughout and nothing changes under it."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from duplex_sidecars.router import pipeline
from duplex_sidecars.router.calibration import Calibration
from duplex_sidecars.router.client_auth import ClientKeys
from duplex_sidecars.router.config import RouterConfig
from duplex_sidecars.router.endpoints import DECODE, PREFILL, Engines
from duplex_sidecars.router.leg_costs import LegCosts
from duplex_sidecars.router.legs import LegClient
from duplex_sidecars.router.metrics import RouterMetrics
from duplex_sidecars.router.picker import Picker, decode_picker, prefill_picker
from duplex_sidecars.router.store import Store

if TYPE_CHECKING:
    from duplex_sidecars.router.tracing import RouterTracer


@dataclass(frozen=True)
class Live:
    """One config generation: the first built by `first`, each next one by `reloaded` on a config change."""

    generation: int  # reported by /ready
    deps: pipeline.Deps
    leg_costs: LegCosts  # /ready shows its rates whatever the placement; only the cost placement's legs use it
    client_keys: ClientKeys | None
    span_exporter: Any = None  # with tracing on, where spans go in place of its endpoint (tests: in memory)

    @classmethod
    def first(
        cls,
        config: RouterConfig,
        engines: Engines,
        store: Store,
        client: LegClient,
        metrics: RouterMetrics,
        span_exporter: Any = None,
    ) -> Live:
        """Generation 1, over the router's long-lived parts (a fabric watch joins them once the router has started)."""
        calibration = calibration_of(config)
        leg_costs = LegCosts(config.placement, calibration)
        pickers: dict[str, Picker] = {
            PREFILL: prefill_picker(config.placement, leg_costs.rates),
            DECODE: decode_picker(),
        }
        deps = pipeline.Deps(
            config=config,
            engines=engines,
            pickers=pickers,
            store=store,
            client=client,
            metrics=metrics,
            engine_api_key=engine_api_key_of(config),
            calibration=calibration,
            leg_costs=cost_placement(config, leg_costs),
            tracer=tracer_of(config, span_exporter),
        )
        return cls(
            generation=1,
            deps=deps,
            leg_costs=leg_costs,
            client_keys=client_keys_of(config),
            span_exporter=span_exporter,
        )

    @property
    def config(self) -> RouterConfig:
        return self.deps.config

    def engine_headers(self) -> dict[str, str]:
        """What the router's own requests to the engines carry (probes, scrapes, /v1/models): the engine key."""
        key = self.deps.engine_api_key
        return {"Authorization": f"Bearer {key}"} if key else {}

    def reloaded(self, new: RouterConfig) -> Live:
        """The next generation. What `new` leaves alone carries over: the calibration's samples unless its settings
        change (a new window starts empty), the placement costs unless they or the calibration change, the client
        keys unless their directory changes, the tracer unless the tracing settings change (the router then shuts
        the old one down)."""
        old, deps = self.config, self.deps
        recalibrate = new.reuse.model_dump(exclude={"min_tokens"}) != old.reuse.model_dump(exclude={"min_tokens"})
        calibration = calibration_of(new) if recalibrate else deps.calibration
        leg_costs, pickers = self.leg_costs, deps.pickers
        if recalibrate or new.placement != old.placement:
            leg_costs = LegCosts(new.placement, calibration)
            pickers = {PREFILL: prefill_picker(new.placement, leg_costs.rates), DECODE: pickers[DECODE]}
        client_keys = self.client_keys
        if new.client_keys_dir != old.client_keys_dir:
            client_keys = client_keys_of(new)
        tracer = deps.tracer if new.tracing == old.tracing else tracer_of(new, self.span_exporter)
        return Live(
            generation=self.generation + 1,
            deps=dataclasses.replace(
                deps,
                config=new,
                pickers=pickers,
                engine_api_key=engine_api_key_of(new),
                calibration=calibration,
                leg_costs=cost_placement(new, leg_costs),
                tracer=tracer,
            ),
            leg_costs=leg_costs,
            client_keys=client_keys,
            span_exporter=self.span_exporter,
        )


def calibration_of(config: RouterConfig) -> Calibration | None:
    r = config.reuse
    return Calibration(r.calibration_window, r.calibration_min_samples) if r.calibrate else None


def cost_placement(config: RouterConfig, leg_costs: LegCosts) -> LegCosts | None:
    """What the request path gets to estimate each prefill leg: only the cost placement reads it, so the other
    policies skip the estimate."""
    return leg_costs if config.placement.prefill == "cost" else None


def engine_api_key_of(config: RouterConfig) -> str | None:
    return os.environ.get(config.engine_api_key_env) if config.engine_api_key_env else None


def client_keys_of(config: RouterConfig) -> ClientKeys | None:
    return ClientKeys(config.client_keys_dir) if config.client_keys_dir else None


def tracer_of(config: RouterConfig, span_exporter: Any = None) -> RouterTracer | None:
    """The tracer when tracing is on (an endpoint; `span_exporter` takes the spans in place of it); None, and
    OpenTelemetry never loaded, when it is off."""
    if config.tracing.endpoint is None:
        return None
    from duplex_sidecars.router.tracing import RouterTracer

    return RouterTracer(config.tracing, span_exporter)

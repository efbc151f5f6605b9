"""What the `cost` placement expects of a prefill leg: the compute queued on each engine, and what a read costs.

Every prefill leg in flight carries the seconds it is expected to compute (`EnginePool.busy`): its new tokens times
the compute rate. A leg's new tokens are its prompt less what it reuses; the prompt is estimated from the leg's body
size at the prompt tokens per byte of the legs answered so far (engines report `usage`). The rates come from
`placement` until the router's calibration has a fit (router/calibration.py), and then from the fit, refreshed at
most every `REFRESH_SECONDS`: the same measurement that sets Auto's threshold sets placement.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from duplex_sidecars.router.calibration import Calibration, tokens_of
from duplex_sidecars.router.config import PlacementConfig

REFRESH_SECONDS = 10.0
_INITIAL_TOKENS_PER_BYTE = 0.25  # about four bytes of JSON a token, until an engine has answered
_SMOOTHING = 0.1  # weight of each new leg in the running tokens-per-byte


@dataclass(frozen=True)
class Rates:
    per_leg: float  # seconds of every leg in flight, whatever its size (scheduling, the HTTP round trip)
    compute_per_token: float
    read_per_token: float
    read_latency: float  # the fixed part of reading decode's blocks back
    calibrated: bool = False

    @classmethod
    def of(cls, placement: PlacementConfig) -> Rates:
        return cls(
            placement.queue_ms_per_leg / 1000,
            placement.compute_ms_per_1k_tokens / 1e6,
            placement.read_ms_per_1k_tokens / 1e6,
            placement.read_latency_ms / 1000,
        )


class LegCosts:
    def __init__(self, placement: PlacementConfig, calibration: Calibration | None = None) -> None:
        self.configured = Rates.of(placement)
        self.calibration = calibration if placement.calibrated else None
        self.tokens_per_byte = _INITIAL_TOKENS_PER_BYTE
        self._rates = self.configured
        self._refreshed = 0.0

    def rates(self) -> Rates:
        if self.calibration is not None and time.monotonic() - self._refreshed > REFRESH_SECONDS:
            self._refreshed = time.monotonic()
            fit = self.calibration.fit()
            if fit is not None:
                self._rates = Rates(
                    self.configured.per_leg,
                    fit.compute_seconds_per_token,
                    max(fit.read_seconds_per_token, 0.0),
                    max(fit.replay_overhead_seconds, 0.0),
                    calibrated=True,
                )
        return self._rates

    def leg_seconds(self, body_bytes: int, reused_tokens: int) -> float:
        """The compute a leg of this body size brings to its engine, reusing `reused_tokens` of its prompt."""
        new_tokens = max(0.0, body_bytes * self.tokens_per_byte - reused_tokens)
        return new_tokens * self.rates().compute_per_token

    def observe(self, body_bytes: int, usage: Any) -> None:
        """A leg answered: its prompt tokens against its body size."""
        tokens = tokens_of(usage)
        if tokens is None or body_bytes <= 0:
            return
        self.tokens_per_byte += _SMOOTHING * (tokens[0] / body_bytes - self.tokens_per_byte)

    def describe(self) -> dict[str, Any]:
        r = self.rates()
        return {
            "calibrated": r.calibrated,
            "compute_ms_per_1k_tokens": round(r.compute_per_token * 1e6, 3),
            "read_ms_per_1k_tokens": round(r.read_per_token * 1e6, 3),
            "read_latency_ms": round(r.read_latency * 1000, 3),
            "tokens_per_byte": round(self.tokens_per_byte, 4),
        }

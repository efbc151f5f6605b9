"""Which engine of a role gets the next leg: candidates in tiers (filters, relaxed in order), then scorers.

A placement policy is one more scorer: it sees each candidate and what the pipeline knows about the request
(`Hints`) and adds to its score. Decode: the engine that holds the conversation's blocks first, then healthy before
not-yet-probed, then the fewest legs in flight; a draining engine (its pod is terminating) only when no other is
left. Prefill (`placement.prefill`): the fewest legs in flight
(least_outstanding, the default), each engine in turn (round_robin), or the least expected cost (cost: the compute
still ahead of it, plus reading the conversation's blocks from decode unless it is the engine whose prefix
cache holds the previous turn). Ties are broken at random, or in turn for round_robin.

A request's KV revision (`Hints.revision`, router/endpoints.py `Engines.target_revision`) comes before all of it: only
engines of that revision are candidates, since another revision's engine cannot read this one's blocks.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from duplex_sidecars.router.config import PlacementConfig
from duplex_sidecars.router.endpoints import Engine, EnginePool
from duplex_sidecars.router.leg_costs import Rates


@dataclass(frozen=True)
class Hints:
    """What the request tells the picker."""

    tried: frozenset[str] = frozenset()  # engines this request's leg already failed on
    sticky: str | None = None  # the engine that served the conversation's previous turn (decode: holds its blocks)
    tokens: int = 0  # prefill: tokens of decode's blocks a replay would read (0 without a replay)
    revision: str | None = None  # the request's KV revision: only its engines are candidates (None: any engine)


Scorer = Callable[[Engine, Hints], float]
Tier = Callable[[Engine, Hints], bool]


def sticky(engine: Engine, hints: Hints) -> float:
    """The engine that served the previous turn: for decode it holds the blocks the next prefill reads."""
    return 1.0 if engine.url == hints.sticky else 0.0


def probed_healthy(engine: Engine, hints: Hints) -> float:
    return 1.0 if engine.healthy else 0.0


def least_outstanding(engine: Engine, hints: Hints) -> float:
    return -float(engine.inflight)


# Each tier is tried only when every earlier one is empty: an engine a leg failed on, or one whose last probe
# failed, is used only when nothing else is left, and a draining one after all of those.
_FALLBACKS: tuple[Tier, ...] = (
    lambda e, h: e.url not in h.tried and e.healthy is not False,
    lambda e, h: e.url not in h.tried,
    lambda e, h: e.healthy is not False,
    lambda e, h: True,
)
TIERS: tuple[Tier, ...] = (
    *(lambda e, h, tier=tier: not e.draining and tier(e, h) for tier in _FALLBACKS),
    *_FALLBACKS,
)


def cost(rates: Callable[[], Rates]) -> Scorer:
    """Minus the expected seconds before this engine can start the leg: the compute still ahead of it (its legs in
    flight less what it has worked off) and a fixed part per leg in flight, plus reading the conversation's blocks
    from decode, which the engine of the previous turn skips for what its prefix cache still holds. The leg's own
    compute is the same on every engine, so it is left out."""

    def score(engine: Engine, hints: Hints) -> float:
        r = rates()
        wait = engine.backlog_seconds() + engine.inflight * r.per_leg
        if hints.tokens and engine.url != hints.sticky:
            wait += r.read_latency + hints.tokens * r.read_per_token
        return -wait

    return score


@dataclass
class Picker:
    """Scorers with weights; the highest total wins within the first non-empty tier. `rotate` breaks ties in turn
    instead of at random."""

    scorers: Sequence[tuple[float, Scorer]] = field(default_factory=tuple)
    tiers: Sequence[Tier] = TIERS
    rotate: bool = False
    _turn: int = 0

    def pick(self, pool: EnginePool, hints: Hints = Hints()) -> Engine | None:
        engines = list(pool.engines.values())
        if hints.revision is not None:
            engines = [e for e in engines if e.revision == hints.revision]
        for tier in self.tiers:
            candidates = [e for e in engines if tier(e, hints)]
            if candidates:
                return self._best(candidates, hints)
        return None

    def _best(self, candidates: list[Engine], hints: Hints) -> Engine:
        if len(candidates) == 1:
            return candidates[0]
        scored = [(sum(w * score(e, hints) for w, score in self.scorers), e) for e in candidates]
        top = max(s for s, _ in scored)
        tied = [e for s, e in scored if s == top]
        if self.rotate:
            self._turn += 1
            return tied[self._turn % len(tied)]
        return random.choice(tied)


def prefill_picker(placement: PlacementConfig | None = None, rates: Callable[[], Rates] | None = None) -> Picker:
    """`rates`: the cost policy's (router/leg_costs.py); the placement's own numbers when not given."""
    placement = placement or PlacementConfig()
    if placement.prefill == "round_robin":
        return Picker(((1.0, probed_healthy),), rotate=True)
    if placement.prefill == "cost":
        fixed = Rates.of(placement)
        return Picker(((1e9, probed_healthy), (1.0, cost(rates or (lambda: fixed)))))
    return Picker(((1000.0, probed_healthy), (1.0, least_outstanding)))


def decode_picker() -> Picker:
    return Picker(((1e6, sticky), (1000.0, probed_healthy), (1.0, least_outstanding)))

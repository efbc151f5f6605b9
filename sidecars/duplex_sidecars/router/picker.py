"""Which engine of a role gets the next leg: candidates in tiers (filters, relaxed in order), then scorers.

A placement policy is one more scorer: it sees each candidate and what the pipeline knows about the request
(`Hints`) and adds to its score. The default scorers reproduce the router's policy: the decode engine that holds
the conversation's blocks first, then healthy before not-yet-probed, then the fewest legs in flight; ties are broken
at random so that equal engines share the load.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from duplex_sidecars.router.endpoints import Engine, EnginePool


@dataclass(frozen=True)
class Hints:
    """What the request tells the picker."""

    tried: frozenset[str] = frozenset()  # engines this request's leg already failed on
    sticky: str | None = None  # the engine that served the conversation's previous turn (decode: holds its blocks)


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
# failed, is used only when nothing else is left.
TIERS: tuple[Tier, ...] = (
    lambda e, h: e.url not in h.tried and e.healthy is not False,
    lambda e, h: e.url not in h.tried,
    lambda e, h: e.healthy is not False,
    lambda e, h: True,
)


@dataclass
class Picker:
    """Scorers with weights; the highest total wins within the first non-empty tier."""

    scorers: Sequence[tuple[float, Scorer]] = field(default_factory=tuple)
    tiers: Sequence[Tier] = TIERS

    def pick(self, pool: EnginePool, hints: Hints = Hints()) -> Engine | None:
        engines = list(pool.engines.values())
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
        return random.choice([e for s, e in scored if s == top])


def prefill_picker() -> Picker:
    return Picker(((1000.0, probed_healthy), (1.0, least_outstanding)))


def decode_picker() -> Picker:
    return Picker(((1e6, sticky), (1000.0, probed_healthy), (1.0, least_outstanding)))

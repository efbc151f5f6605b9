"""What a reused token saves, fitted from the router's own prefill legs: the inputs of the recompute threshold that
`kvTransfer.recomputeThreshold: Auto` renders (operator/duplex/auto_threshold.py).

Each prefill leg that answered, and had its engine to itself from start to end (a leg that waited behind
another measures the queue, not the engine), is a sample: the tokens prefill computed, the tokens it read back from
decode (0 on a miss), and the leg's seconds. A least-squares fit over the latest `window` samples of

    seconds = base + compute * computed + read * read_tokens + overhead * replayed

says what a token costs computed and read, and what a replay costs on top of that whatever its size (the engine
step that waits for the read, the handshake, the notification). Reading n tokens instead of computing them pays
when n * compute > overhead + n * read: the break-even is n = overhead / (compute - read), below which prefill
should recompute. The fit needs both kinds of legs with sizes that vary; until then it says nothing. Legs far off
a first fit (a first handshake, a leg stuck behind another) are left out of the second, which is the answer.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

_FEATURES = 4  # base, computed, read, replayed
_JITTER_SECONDS = 0.05  # a leg's time is judged against at least this: a few ms off a 10 ms leg is no outlier


@dataclass(frozen=True)
class Fit:
    compute_seconds_per_token: float
    read_seconds_per_token: float
    replay_overhead_seconds: float
    recomputes: int  # samples behind the fit
    replays: int
    threshold: int | None  # the break-even in tokens; None: reading never pays (a token reads slower than it computes)
    noise: float = 0.0  # how far the median leg is off the fit, relative to its size: 0.05 is a clean measurement

    def report(self) -> dict[str, Any]:
        return asdict(self)


def break_even(compute: float, read: float, overhead: float) -> int | None:
    read = max(read, 0.0)
    if compute <= read:
        return None
    return max(0, math.ceil(overhead / (compute - read)))


def tokens_of(usage: Any) -> tuple[int, int] | None:
    """(prompt tokens, of them served from prefill's own prefix cache) from a leg's `usage`: OpenAI's
    prompt_tokens[_details.cached_tokens] or the Responses and Messages APIs' input_tokens; None when absent."""
    if not isinstance(usage, dict):
        return None
    prompt = usage.get("prompt_tokens", usage.get("input_tokens"))
    if not isinstance(prompt, int) or prompt <= 0:
        return None
    details = usage.get("prompt_tokens_details") or usage.get("input_tokens_details") or {}
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return prompt, cached if isinstance(cached, int) and 0 <= cached <= prompt else 0


class Calibration:
    """The latest prefill legs, and the fit over them."""

    def __init__(self, window: int = 512, min_samples: int = 16) -> None:
        self.min_samples = min_samples
        self._samples: deque[tuple[float, float, float, float]] = deque(maxlen=window)

    def observe(self, usage: Any, read_tokens: int, seconds: float) -> None:
        """A leg that answered: its reply's `usage`, the tokens it was offered from decode (0: a miss)."""
        tokens = tokens_of(usage)
        if tokens is None or seconds <= 0:
            return
        prompt, cached = tokens
        read = min(read_tokens, prompt)
        # vLLM counts tokens read over NIXL among a request's cached tokens; what is left was computed.
        computed = prompt - max(cached, read)
        self._samples.append((float(computed), float(read), 1.0 if read else 0.0, seconds))

    def legs(self) -> dict[str, int]:
        """The legs in the window, of each kind (the fit may leave some out)."""
        replays = sum(1 for sample in self._samples if sample[2])
        return {"recomputes": len(self._samples) - replays, "replays": replays}

    def report(self) -> dict[str, Any] | None:
        """What /ready and the fabric report carry: the fit with the window's legs, or the legs alone until there is
        a fit (the operator then finds no inputs in it); None before any leg."""
        if not self._samples:
            return None
        fit = self.fit()
        return {**(fit.report() if fit is not None else {}), "legs": self.legs()}

    def fit(self) -> Fit | None:
        rows = np.array(self._samples, dtype=float).reshape(-1, 4)
        replays = int(rows[:, 2].sum())
        recomputes = len(rows) - replays
        if min(replays, recomputes) < self.min_samples:
            return None
        design = np.column_stack([np.ones(len(rows)), rows[:, :3]])
        if np.linalg.matrix_rank(design) < _FEATURES:
            return None  # sizes that never vary cannot tell a token's cost from a leg's
        # Legs far off the fit are left out and it is fitted again, until it holds (a new pair's first NIXL handshake
        # took 40 s on 2 cores): off, relative to their size, by more than 4 robust standard deviations (1.4826 MAD)
        # and by half.
        keep = np.ones(len(rows), dtype=bool)
        for _ in range(4):
            coef = np.linalg.lstsq(design[keep], rows[keep, 3], rcond=None)[0]
            predicted = design @ coef
            off = np.abs(rows[:, 3] - predicted) / np.maximum(np.abs(predicted), _JITTER_SECONDS)
            fits = off <= max(4 * 1.4826 * float(np.median(off[keep])), 0.5)
            if (fits == keep).all() or np.linalg.matrix_rank(design[fits]) < _FEATURES:
                break
            keep = fits
        coef = np.linalg.lstsq(design[keep], rows[keep, 3], rcond=None)[0]
        predicted = design[keep] @ coef
        noise = float(np.median(np.abs(rows[keep, 3] - predicted) / np.maximum(np.abs(predicted), _JITTER_SECONDS)))
        replays = int(rows[keep, 2].sum())
        recomputes = int(keep.sum()) - replays
        _, compute, read, overhead = (float(c) for c in coef)
        if compute <= 0:
            return None  # noise, not a measurement: computing a token always costs something
        return Fit(compute, read, overhead, recomputes, replays, break_even(compute, read, overhead), round(noise, 4))

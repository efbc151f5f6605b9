"""The receipt on every answer: a W3C `Server-Timing` header saying where the time to the first byte went and
whether the turn read decode's KV back, so that a client (or a benchmark) can tell why a turn was fast or slow.

    Server-Timing: router;dur=0.6, prefill;dur=212.4, decode;dur=35.1, kv;desc="hit:4032"

* `prefill`: the prefill leg that answered, from its start to its reply; on a hit it holds prefill's read of decode's
  blocks (vLLM reports no per-request read time).
* `decode`: from the decode leg's start to the answer's first byte (a stream's first event, or the whole body).
* `router`: the rest of the time to the first byte: the store lookup, picking engines, failed attempts, relaying.
* `kv`: `hit:<tokens>` (tokens decode's blocks covered) or `miss:<reason>` (the miss reasons of
  duplex_router_kv_reuse_misses_total, router/README.md; `revision_changed` after a KV-incompatible rollout moved the
  conversation to the new engines). Clients without a key or Authorization share one tenant, so their misses say
  only `miss`: the reason could tell one of them what another sent.

It goes out with the answer's head, so a stream carries the same entries as a whole body; its total time is what
the client measures. Nothing in it names an engine, an address or a block.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_ENTRY = re.compile(r'^(router|prefill|decode);dur=(\d+(?:\.\d+)?)$|^kv;desc="((?:hit:\d+)|(?:miss(?::[a-z_]+)?))"$')


def server_timing(
    to_first_byte: float,
    prefill: float | None,
    decode: float | None,
    verdict: str,
) -> str:
    """The header's value; times in seconds, written in milliseconds."""
    router = max(0.0, to_first_byte - (prefill or 0.0) - (decode or 0.0))
    parts = [f"router;dur={router * 1000:.1f}"]
    if prefill is not None:
        parts.append(f"prefill;dur={prefill * 1000:.1f}")
    if decode is not None:
        parts.append(f"decode;dur={decode * 1000:.1f}")
    parts.append(f'kv;desc="{verdict}"')
    return ", ".join(parts)


def verdict(replayed: bool, tokens: int, reason: str | None, shared_tenant: bool) -> str:
    if replayed:
        return f"hit:{tokens}"
    return "miss" if shared_tenant else f"miss:{reason or 'no_entry'}"


@dataclass(frozen=True)
class Receipt:
    """A receipt read back (benchmarks, the canary, tests): durations in seconds, None where the answer had none."""

    router: float
    prefill: float | None
    decode: float | None
    kv: str

    @property
    def hit(self) -> bool:
        return self.kv.startswith("hit:")

    @property
    def tokens(self) -> int:
        """Tokens read back from decode's blocks (0 on a miss)."""
        return int(self.kv[4:]) if self.hit else 0

    @property
    def reason(self) -> str | None:
        """The miss reason; None on a hit or where the receipt withholds it (the anonymous tenant)."""
        return self.kv[5:] if self.kv.startswith("miss:") else None

    @property
    def to_first_byte(self) -> float:
        return self.router + (self.prefill or 0.0) + (self.decode or 0.0)


def parse(header: str) -> Receipt:
    """The receipt in a Server-Timing value; ValueError when it is not one this router writes."""
    durations: dict[str, float] = {}
    kv = None
    for part in header.split(", "):
        match = _ENTRY.match(part.strip())
        if not match:
            raise ValueError(f"not a duplex receipt entry: {part!r}")
        if match.group(3):
            kv = match.group(3)
        else:
            durations[match.group(1)] = float(match.group(2)) / 1000
    if kv is None or "router" not in durations:
        raise ValueError(f"a receipt needs router;dur and kv;desc: {header!r}")
    return Receipt(durations["router"], durations.get("prefill"), durations.get("decode"), kv)

"""The reuse decision: whether a turn's prefill leg may replay the blocks decode retained after the previous turn,
and what to record after decode answers. Any doubt is a miss (plain recompute), never an error.

With the tenant inside the store key, another tenant's state is simply absent: a foreign tenant's lookup is a
`no_entry` miss, so there is no separate `tenant_mismatch` reason.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from duplex_sidecars import protocol
from duplex_sidecars.router.endpoints import EnginePool
from duplex_sidecars.router.history import Reply, reply_not_storable, request_not_storable
from duplex_sidecars.router.metrics import RouterMetrics
from duplex_sidecars.router.store import NOT_REPLAYABLE, Entry, Store, StoreError
from duplex_sidecars.router.turn import Turn

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Decision:
    params: dict[str, Any] | None  # the prefill leg's kv_transfer_params on a hit
    reason: str | None  # the miss reason otherwise
    sticky_decode: str | None = None  # the decode engine that served the previous turn
    tokens: int = 0


def _miss(reason: str, sticky: str | None = None) -> Decision:
    return Decision(None, reason, sticky)


async def lookup(store: Store, turn: Turn, decode_pool: EnginePool, metrics: RouterMetrics) -> Decision:
    """Take the conversation's entry (single use) and decide. Never raises."""
    if turn.key is None:
        return _miss("no_conversation_id")
    if turn.history is None:
        # The entry stays: this request cannot use it, a later well-formed turn still may.
        return _miss("not_replayable")
    try:
        entry = await store.take(turn.key)
    except StoreError:
        metrics.store_errors.labels("take").inc()
        return _miss("store_error")
    if entry is None:
        return _miss("no_entry")
    _observe_bytes(store, metrics)
    sticky = entry.decode_url
    if not entry.replayable:
        return _miss(entry.reason or NOT_REPLAYABLE, sticky if entry.reason != "endpoint_gone" else None)
    if entry.expired:
        return _miss("expired", sticky)
    if entry.decode_url not in decode_pool:
        return _miss("endpoint_gone")
    if entry.scope != turn.scope:
        return _miss("scope_mismatch", sticky)
    if entry.covered is None or not turn.history.matches(entry.covered):
        return _miss("history_mismatch", sticky)
    try:
        stored = entry.params  # unpacked only here, on a hit
    except StoreError:
        metrics.store_errors.labels("take").inc()
        return _miss("store_error", sticky)
    assert stored is not None
    params = protocol.replay_params(stored)
    tokens = params.get("remote_num_tokens")
    return Decision(params, None, sticky, tokens if isinstance(tokens, int) else 0)


async def record(
    store: Store, turn: Turn, decode_url: str, kv_params: Any, reply: Reply, ttl: float, metrics: RouterMetrics
) -> str:
    """Store what decode retained after this turn (or a tombstone saying it cannot be replayed); returns the
    capture outcome for metrics."""
    if turn.key is None:
        return "not_stored"
    replayable = protocol.replayable_decode_params(kv_params)
    why = None
    if kv_params is None:
        outcome, why = "no_params", "decode returned no kv_transfer_params"
    elif replayable is None:
        outcome, why = "not_replayable", "decode's kv_transfer_params are incomplete"
    else:
        outcome = "stored"
        why = request_not_storable(turn.route, turn.body) or reply_not_storable(turn.body, reply)
        if why is None and turn.history is None:
            why = "the request's history cannot be compared"
        if why is not None:
            outcome = "not_replayable"
    if why is not None:
        log.debug("request %s: not storing decode's blocks: %s", turn.request_id, why)
        entry = Entry(decode_url=decode_url, reason=NOT_REPLAYABLE)
    else:
        assert turn.history is not None and replayable is not None
        entry = Entry(
            decode_url=decode_url,
            params=replayable,
            covered=turn.history.covered_with(reply),
            scope=turn.scope,
        )
    try:
        evicted = await store.put(turn.key, entry, ttl)
    except StoreError:
        metrics.store_errors.labels("put").inc()
        return "store_error"
    if evicted:
        metrics.store_dropped.inc(evicted)
    _observe_bytes(store, metrics)
    return outcome


def _observe_bytes(store: Store, metrics: RouterMetrics) -> None:
    held = store.bytes_held()
    if held is not None:
        metrics.store_bytes.set(held)

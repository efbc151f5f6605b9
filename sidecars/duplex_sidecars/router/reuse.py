"""The reuse decision, as pure functions: whether a turn's prefill leg may replay the blocks decode retained after
the previous turn (`decide`), and what to store after decode has answered (`after_decode`). Any doubt is a miss
(plain recompute), never an error.

With the tenant inside the store key, another tenant's state is simply absent: a foreign tenant's lookup is a
`no_entry` miss, so there is no separate `tenant_mismatch` reason.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Container
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlsplit

from duplex_sidecars import protocol
from duplex_sidecars.router.history import Reply, reply_not_storable
from duplex_sidecars.router.store import ENDPOINT_GONE, NOT_REPLAYABLE, Entry, StoreError
from duplex_sidecars.router.turn import Turn

# Tombstone reasons for a decode reply without params, so that the next turn's miss says why.
NO_PARAMS = "no_params"  # decode sent no kv_transfer_params (not started with bidirectional_kv_xfer?)
STREAM_NO_PARAMS = "stream_no_params"  # ... in a streamed answer (vLLM before 0.33 streams none)
REASONING = "reasoning"  # the reply carried reasoning, which the next prompt drops
BELOW_THRESHOLD = "below_threshold"  # fewer reusable tokens than reuse.min_tokens: recomputing them is cheaper
ENDPOINT_UNHEALTHY = "endpoint_unhealthy"  # the decode engine holding the blocks is marked unhealthy
ENDPOINT_DRAINING = "endpoint_draining"  # the previous turn's decode engine was draining: nothing was bound to it
# The stored side channel (remote_host) is not the address of the decode engine the entry names: replaying it would
# send prefill's NIXL handshake somewhere else.
SIDE_CHANNEL_MISMATCH = "side_channel_mismatch"
# The decode engine holding the blocks runs another KV revision than the one this request goes to (a rollout): no
# prefill engine of this request's revision can read them.
REVISION_CHANGED = "revision_changed"


class _StoreFailed:
    """The store did not answer the lookup (timed out, backing off, raised)."""

    def __repr__(self) -> str:
        return "STORE_FAILED"


STORE_FAILED: Final = _StoreFailed()


@dataclass(frozen=True)
class Decision:
    params: dict[str, Any] | None  # the prefill leg's kv_transfer_params on a hit
    reason: str | None  # the miss reason otherwise
    sticky_decode: str | None = None  # the decode engine that served the previous turn
    tokens: int = 0  # remote_num_tokens offered to prefill
    previous_prefill: str | None = None  # the prefill engine of the previous turn (its prefix cache may hold it)

    @property
    def hit(self) -> bool:
        return self.params is not None


def _miss(reason: str, sticky: str | None = None, previous_prefill: str | None = None) -> Decision:
    return Decision(None, reason, sticky, previous_prefill=previous_prefill)


def _unknown_revision(url: str) -> str | None:
    return None


def needs_lookup(turn: Turn) -> Decision | None:
    """The miss a turn gets without asking the store, or None when its entry must be taken."""
    if turn.key is None:
        return _miss(turn.no_key_reason)
    if turn.history is None:
        # The entry stays in the store: this request cannot use it, a later well-formed turn still may.
        return _miss(NOT_REPLAYABLE)
    return None


def decide(
    turn: Turn,
    entry: Entry | _StoreFailed | None,
    decode_endpoints: Container[str],
    min_tokens: int = 0,
    unhealthy: Container[str] = (),
    check_side_channel: bool = True,
    revision: str | None = None,
    revision_of: Callable[[str], str | None] = _unknown_revision,
) -> Decision:
    """Replay or miss for a turn whose entry was taken from the store (single use: it is gone from the store now).
    Fewer than `min_tokens` reusable tokens are cheaper to recompute (router config reuse.min_tokens). Blocks held by
    a decode engine marked `unhealthy` are not read: prefill would wait out the replay timeout on an engine that
    failed its probe or its last leg, then recompute anyway. With `check_side_channel`, an engine named by its IP
    address must advertise that address as its side channel (`remote_host`). Blocks of a decode engine whose KV
    revision (`revision_of` its URL) is known and not the request's `revision` are not read either: the request's
    prefill engine is of another revision."""
    early = needs_lookup(turn)
    if early is not None:
        return early
    if isinstance(entry, _StoreFailed):
        return _miss("store_error")
    if entry is None:
        return _miss("no_entry")
    sticky, prefill = entry.decode_url, entry.prefill_url
    if not entry.replayable:
        reason = entry.reason or NOT_REPLAYABLE
        return _miss(reason, None if reason == ENDPOINT_GONE else sticky, prefill)
    if entry.expired:
        return _miss("expired", sticky, prefill)
    if entry.decode_url not in decode_endpoints:
        return _miss(ENDPOINT_GONE, None, prefill)
    if _other_revision(revision, revision_of(entry.decode_url)):
        return _miss(REVISION_CHANGED, None, prefill)
    if entry.decode_url in unhealthy:
        return _miss(ENDPOINT_UNHEALTHY, None, prefill)
    if entry.scope != turn.scope:
        return _miss("scope_mismatch", sticky, prefill)
    assert turn.history is not None  # needs_lookup
    if entry.covered is None or not turn.history.matches(entry.covered):
        return _miss("history_mismatch", sticky, prefill)
    try:
        stored = entry.params  # unpacked only here, on a hit
    except StoreError:
        return _miss("store_error", sticky, prefill)
    assert stored is not None
    params = protocol.replay_params(stored)
    if check_side_channel and not side_channel_of(entry.decode_url, params.get("remote_host")):
        return _miss(SIDE_CHANNEL_MISMATCH, None, prefill)
    tokens = params.get("remote_num_tokens")
    tokens = tokens if isinstance(tokens, int) else 0
    if tokens < min_tokens:
        return _miss(BELOW_THRESHOLD, sticky, prefill)
    return Decision(params, None, sticky, tokens, prefill)


def _other_revision(wanted: str | None, held: str | None) -> bool:
    """Both revisions known, and not the same."""
    return wanted is not None and held is not None and wanted != held


def side_channel_of(decode_url: str, remote_host: Any) -> bool:
    """Whether `remote_host` can be the side channel of the engine at `decode_url`: the same IP address when the URL
    names one (as discovered engines' URLs do); an engine named by host name is not checked (its address is DNS's)."""
    try:
        engine = ipaddress.ip_address(urlsplit(decode_url).hostname or "")
    except ValueError:
        return True
    try:
        return ipaddress.ip_address(str(remote_host)) == engine
    except ValueError:
        return False


@dataclass(frozen=True)
class Capture:
    """What decode's answer leaves for the conversation's next turn."""

    outcome: str  # the capture metric's outcome: stored, not_replayable, no_params, not_stored
    entry: Entry | None = None  # what to store (an entry or a tombstone); None: nothing
    key: str | None = None  # where
    why: str | None = None  # for the debug log


def after_decode(
    turn: Turn,
    decode_url: str,
    kv_params: Any,
    reply: Reply,
    prefill_url: str | None = None,
    draining: bool = False,
) -> Capture:
    """The entry to store after decode answered `reply` with `kv_params` (None when it sent none), and where. A reply
    that cannot be replayed leaves a tombstone saying why, so that the next turn's miss names the cause. A `draining`
    decode engine (one that is not the last) gets no binding: its pod's preStop hook waits for the bindings it holds
    to end."""
    if turn.keying is None:
        return Capture("not_stored")
    covered = turn.api.covered(turn.history, reply) if turn.history is not None else None
    key = turn.store_key(covered)
    if key is None:
        return Capture("not_stored", why="no key for this history")

    def tombstone(outcome: str, reason: str, why: str) -> Capture:
        return Capture(outcome, Entry(decode_url=decode_url, reason=reason, prefill_url=prefill_url), key, why)

    if draining:
        return tombstone(NOT_REPLAYABLE, ENDPOINT_DRAINING, "the decode engine is draining")
    if kv_params is None:
        return tombstone(NO_PARAMS, STREAM_NO_PARAMS if turn.stream else NO_PARAMS, "decode sent no kv_transfer_params")
    replayable = protocol.replayable_decode_params(kv_params)
    if replayable is None:
        return tombstone(NOT_REPLAYABLE, NOT_REPLAYABLE, "decode's kv_transfer_params are incomplete")
    if reply.reasoning:
        # Clients and chat templates drop earlier reasoning from the next prompt, which then does not start with what
        # decode computed (vLLM issue #43094): unusable by construction, and counted apart.
        return tombstone(NOT_REPLAYABLE, REASONING, "the reply carries reasoning the next prompt drops")
    why = turn.api.not_storable(turn.body) or reply_not_storable(turn.body, reply)
    if why is not None:
        return tombstone(NOT_REPLAYABLE, NOT_REPLAYABLE, why)
    if covered is None:
        return tombstone(NOT_REPLAYABLE, NOT_REPLAYABLE, "the request's history cannot be compared")
    entry = Entry(decode_url=decode_url, params=replayable, covered=covered, scope=turn.scope, prefill_url=prefill_url)
    return Capture("stored", entry, key)

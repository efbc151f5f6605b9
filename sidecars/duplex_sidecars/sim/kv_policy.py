"""The decisions of vLLM's pull scheduler and worker, as pure functions (see vllm-pd-protocol.md §1.3)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from duplex_sidecars.protocol import block_count

# P declines a read of decode's blocks this close to their expiry (vLLM's _KV_BLOCKS_EXPIRY_SAFETY_MARGIN).
EXPIRY_SAFETY_MARGIN_S = 5.0

_REMOTE_KEYS = ("remote_engine_id", "remote_request_id", "remote_host", "remote_port")


def is_prefill_request(params: Any) -> bool:
    """vLLM: a request with do_remote_decode is on the P node; anything else with params is on the D node."""
    return isinstance(params, dict) and bool(params.get("do_remote_decode"))


def has_remote_blocks(params: Any) -> bool:
    """The params name blocks on a remote engine that this engine could read."""
    return (
        isinstance(params, dict)
        and block_count(params.get("remote_block_ids")) > 0
        and all(params.get(k) not in (None, "") for k in _REMOTE_KEYS)
    )


def flat_block_ids(block_ids: Any) -> list[int]:
    """`remote_block_ids` of the (single) KV cache group, whether sent flat or as a list per group."""
    if isinstance(block_ids, list) and block_ids and all(isinstance(g, list) for g in block_ids):
        block_ids = block_ids[0]
    if not isinstance(block_ids, list) or not all(isinstance(b, int) and not isinstance(b, bool) for b in block_ids):
        raise ValueError("remote_block_ids must be a list of ints or a list of such lists")
    return list(block_ids)


def remote_token_count(remote_num_tokens: Any, prompt_len: int, local_hits: int) -> int:
    """Tokens P would pull: min(remote_num_tokens, prompt_len) - local prefix hits (vLLM's `count`)."""
    remote = remote_num_tokens if isinstance(remote_num_tokens, int) and remote_num_tokens >= 0 else prompt_len
    return min(remote, prompt_len) - local_hits


def below_recompute_threshold(count: int, threshold: int) -> bool:
    """vLLM: 0 < count < kv_recompute_threshold (a threshold of 0 disables the check) -> recompute locally."""
    return threshold > 0 and 0 < count < threshold


def is_expired(expiry_time: Any, clock_offset: float, now: float, margin: float = EXPIRY_SAFETY_MARGIN_S) -> bool:
    """vLLM #47021: decline when now + margin >= the remote deadline converted to our clock.

    `expiry_time` is on decode's perf_counter; `clock_offset` = remote clock - local clock (from the handshake).
    A missing deadline reads as usual.
    """
    if not isinstance(expiry_time, (int, float)) or isinstance(expiry_time, bool):
        return False
    return now + margin >= expiry_time - clock_offset


@dataclass(frozen=True)
class PullPlan:
    """Which tokens and block positions a reader pulls: tokens [start, end), block positions [first, last)."""

    start: int
    end: int
    block_size: int

    @property
    def num_tokens(self) -> int:
        return self.end - self.start

    @property
    def positions(self) -> range:
        return range(self.start // self.block_size, -(-self.end // self.block_size))


def pull_plan(local_hits: int, count: int, block_size: int) -> PullPlan:
    """Local hits are whole blocks, so the pull starts on a block boundary and may end inside a block."""
    return PullPlan(local_hits, local_hits + count, block_size)

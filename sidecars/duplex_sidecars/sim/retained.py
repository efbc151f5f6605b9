"""Blocks an engine keeps after a request finished so a remote engine can read them (single use).

Decode keeps them for `decoder_kv_blocks_ttl` (no renewal); prefill keeps them for `kv_lease_duration`. A reader
claims the entry before its NIXL READ and releases it after, which frees the blocks: replaying the same params later
finds nothing instead of reading memory that was reused.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass
class Retained:
    block_ids: list[int]
    num_tokens: int
    deadline: float  # on this engine's perf_counter
    claimed: bool = False


class ClaimRefused(Exception):
    """Why a reader may not read an entry: blocks_gone (never retained, freed or expired), claimed, block_mismatch."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class RetainedBlocks:
    def __init__(self) -> None:
        self._entries: dict[str, Retained] = {}

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def num_blocks(self) -> int:
        return sum(len(e.block_ids) for e in self._entries.values())

    def retain(self, request_id: str, block_ids: Sequence[int], num_tokens: int, deadline: float) -> None:
        self._entries[request_id] = Retained(list(block_ids), num_tokens, deadline)

    def claim(self, request_id: str, block_ids: Sequence[int], now: float) -> Retained:
        """Reserve an entry for one reader, who may read only blocks the entry holds."""
        entry = self._entries.get(request_id)
        if entry is None or entry.deadline <= now:
            raise ClaimRefused("blocks_gone")
        if entry.claimed:
            raise ClaimRefused("claimed")
        if not set(block_ids) <= set(entry.block_ids):
            raise ClaimRefused("block_mismatch")
        entry.claimed = True
        return entry

    def release(self, request_id: str) -> list[int]:
        """Forget an entry; returns the blocks the caller must free (empty if it was already gone)."""
        entry = self._entries.pop(request_id, None)
        return entry.block_ids if entry else []

    def expired(self, now: float) -> list[str]:
        """Entries whose time is up, claimed or not (a reader that died mid-read must not pin memory forever)."""
        return [rid for rid, e in self._entries.items() if e.deadline <= now]

"""Blocks an engine keeps after a request finished so a remote engine can read them (single use).

Decode keeps them for `decoder_kv_blocks_ttl` (no renewal); prefill keeps them for `kv_lease_duration`. A reader
claims the entry before its NIXL READ and releases it after (normally with the READ's NIXL notification), which frees
the blocks: replaying the same params later finds nothing instead of reading memory that was reused.
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
    reader: str = ""  # the claimant's NIXL agent, when it said


class ClaimRefused(Exception):
    """Why a reader may not read an entry: blocks_gone (never retained, freed or expired), claimed, block_mismatch."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class RetainedBlocks:
    def __init__(self) -> None:
        self._entries: dict[str, Retained] = {}
        self._num_claimed = 0  # counted, not summed: the owner asks after every note check
        self._num_blocks = 0  # likewise: asked after every request

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def num_blocks(self) -> int:
        return self._num_blocks

    def is_claimed(self, request_id: str) -> bool:
        entry = self._entries.get(request_id)
        return entry is not None and entry.claimed

    @property
    def num_claimed(self) -> int:
        return self._num_claimed

    def retain(self, request_id: str, block_ids: Sequence[int], num_tokens: int, deadline: float) -> None:
        self.release(request_id)  # a request id retained again replaces its entry
        self._entries[request_id] = Retained(list(block_ids), num_tokens, deadline)
        self._num_blocks += len(block_ids)

    def claim(self, request_id: str, block_ids: Sequence[int], now: float, reader: str = "") -> Retained:
        """Reserve an entry for one reader, who may read only blocks the entry holds."""
        entry = self._entries.get(request_id)
        if entry is None or entry.deadline <= now:
            raise ClaimRefused("blocks_gone")
        if entry.claimed:
            raise ClaimRefused("claimed")
        if not set(block_ids) <= set(entry.block_ids):
            raise ClaimRefused("block_mismatch")
        entry.claimed, entry.reader = True, reader
        self._num_claimed += 1
        return entry

    def release(self, request_id: str, reader: str | None = None) -> list[int]:
        """Forget an entry; returns the blocks the caller must free (empty if it was already gone). With `reader`,
        only that reader's claim is released: a READ-complete note from any other agent changes nothing."""
        entry = self._entries.get(request_id)
        if entry is None or (reader is not None and not (entry.claimed and entry.reader == reader)):
            return []
        del self._entries[request_id]
        self._num_claimed -= entry.claimed
        self._num_blocks -= len(entry.block_ids)
        return entry.block_ids

    def expired(self, now: float) -> list[str]:
        """Entries whose time is up, claimed or not (a reader that died mid-read must not pin memory forever)."""
        return [rid for rid, e in self._entries.items() if e.deadline <= now]

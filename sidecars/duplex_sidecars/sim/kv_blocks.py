"""KV blocks: what their bytes must be, and the engine's block pool with a prefix cache.

A block holds `block_size` token slots. The bytes of a slot are a pure function of the exact token prefix ending at
that token (a blake2b hash chain, tiled to the slot size), so any reader can recompute what a block it read must
contain and detect stale, foreign or garbage blocks. A full block's prefix-cache key is the chain hash of its last
token, i.e. of the whole prefix it covers.
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

DIGEST_BYTES = 16


def token_chain(tokens: Sequence[int], model: str = "sim", prev: bytes | None = None) -> np.ndarray:
    """Per-token prefix hashes, shape (len(tokens), DIGEST_BYTES): row i identifies tokens[: i + 1].

    `prev` continues a chain: pass the last row (as bytes) of the chain of the tokens before these.
    """
    if prev is None:
        prev = _chain_root(model)
    n = len(tokens)
    pieces = []
    whole = n - n % _MEMO_RUN
    for start in range(0, whole, _MEMO_RUN):
        run = tuple(tokens[start : start + _MEMO_RUN])
        key = (prev, run)
        rows = _memo.get(key)
        if rows is None:
            rows = _memo[key] = _extend(prev, run)
            if len(_memo) > _MEMO_RUNS:
                _memo.popitem(last=False)
        pieces.append(rows)
        prev = rows[-DIGEST_BYTES:]
    if whole < n:
        pieces.append(_extend(prev, tokens[whole:]))
    return np.frombuffer(bytearray(b"".join(pieces)), dtype=np.uint8).reshape(n, DIGEST_BYTES)


# The chain is a pure function, and every turn of a conversation hashes the same history again: runs of tokens are
# remembered by (the row before them, their tokens), oldest forgotten first (about 21 MB when full).
_MEMO_RUN = 16
_MEMO_RUNS = 1 << 14
_memo: OrderedDict[tuple[bytes, tuple[int, ...]], bytes] = OrderedDict()


@functools.lru_cache(maxsize=64)
def _chain_root(model: str) -> bytes:
    return hashlib.blake2b(model.encode(), digest_size=DIGEST_BYTES, person=b"duplex-sim-kv").digest()


def _extend(prev: bytes, tokens: Sequence[int]) -> bytes:
    """The chain rows of `tokens` after the row `prev`, concatenated."""
    blake2b = hashlib.blake2b
    rows = []
    for tok in tokens:
        prev = blake2b(prev + tok.to_bytes(4, "little"), digest_size=DIGEST_BYTES).digest()
        rows.append(prev)
    return b"".join(rows)


def block_hashes(chain: np.ndarray, block_size: int, salt: str | None = None) -> list[bytes]:
    """Prefix-cache keys of the full blocks a token sequence fills. A request's `cache_salt` changes every key, as
    vLLM's does (it enters the first block's hash, which every later one chains from): salted prompts share cached
    blocks only with prompts of the same salt."""
    keys = [chain[i + block_size - 1].tobytes() for i in range(0, len(chain) - block_size + 1, block_size)]
    if salt is None:
        return keys
    prefix = salt.encode()  # every key has the same length, so salt + key never reads as another pair
    return [hashlib.blake2b(prefix + k, digest_size=len(k), person=b"duplex-sim-salt").digest() for k in keys]


def slot_bytes(chain_rows: np.ndarray, slot_size: int) -> np.ndarray:
    """The bytes of the slots for these chain rows, shape (rows, slot_size)."""
    reps = math.ceil(slot_size / DIGEST_BYTES)
    return np.tile(chain_rows, (1, reps))[:, :slot_size]


def num_blocks_for(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


class OutOfBlocks(RuntimeError):
    """The pool has no free or evictable block left (the HTTP layer answers 503)."""


@dataclass
class Verification:
    """What a reader found when it compared blocks it read with the bytes they must hold."""

    bad_positions: list[int]  # block positions (in the sequence) whose slots did not match

    @property
    def ok(self) -> bool:
        return not self.bad_positions


class BlockPool:
    """Fixed-size KV memory: a (num_blocks, block_bytes) uint8 buffer, ref-counted blocks and a prefix cache.

    As in vLLM, a freed full block stays in the prefix cache until its memory is reused (LRU order), so the blocks
    decode retained last turn become local hits for the next turn.
    """

    def __init__(self, num_blocks: int, block_size: int, block_bytes: int, model: str = "sim"):
        if block_bytes % block_size:
            raise ValueError("block_bytes must be a multiple of block_size (whole token slots)")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.block_bytes = block_bytes
        self.slot_size = block_bytes // block_size
        self.model = model
        self.buffer = np.zeros((num_blocks, block_bytes), dtype=np.uint8)
        self._slots = self.buffer.reshape(num_blocks, block_size, self.slot_size)
        self._refs = [0] * num_blocks
        self._free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))  # LRU first
        self._cached: dict[bytes, int] = {}
        self._hash_of: dict[int, bytes] = {}

    # -- accounting -------------------------------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        return len(self._free)

    def ref(self, block_id: int) -> None:
        if self._refs[block_id] == 0:
            self._free.pop(block_id, None)
        self._refs[block_id] += 1

    def allocate(self, n: int) -> list[int]:
        """n blocks of fresh memory, evicting the least recently freed cached blocks."""
        if n > len(self._free):
            raise OutOfBlocks(f"need {n} KV blocks, {len(self._free)} free of {self.num_blocks}")
        out = []
        for _ in range(n):
            block_id, _ = self._free.popitem(last=False)
            old = self._hash_of.pop(block_id, None)
            if old is not None:
                del self._cached[old]
            self._refs[block_id] = 1
            out.append(block_id)
        return out

    def free(self, block_ids: Sequence[int]) -> None:
        # Reverse order so a request's tail blocks are evicted before its head (vLLM does the same).
        for block_id in reversed(block_ids):
            self._refs[block_id] -= 1
            if self._refs[block_id] == 0:
                self._free[block_id] = None

    # -- prefix cache -----------------------------------------------------------------------------------------
    def match_prefix(self, hashes: Sequence[bytes]) -> list[int]:
        """Reference and return the cached blocks of the longest cached prefix of `hashes`."""
        hits = []
        for h in hashes:
            block_id = self._cached.get(h)
            if block_id is None:
                break
            hits.append(block_id)
        for block_id in hits:
            self.ref(block_id)
        return hits

    def cache(self, block_ids: Sequence[int], hashes: Sequence[bytes]) -> None:
        """Publish full blocks in the prefix cache (the first block holding a prefix keeps it)."""
        for block_id, h in zip(block_ids, hashes, strict=False):
            if h not in self._cached and block_id not in self._hash_of:
                self._cached[h] = block_id
                self._hash_of[block_id] = h

    # -- contents ---------------------------------------------------------------------------------------------
    def write(self, block_ids: Sequence[int], chain: np.ndarray, start: int, end: int) -> None:
        """Fill the slots of tokens [start, end) of a sequence laid out on `block_ids` ("computing" their KV)."""
        data = slot_bytes(chain[start:end], self.slot_size)
        for pos in range(start // self.block_size, num_blocks_for(end, self.block_size)):
            lo = max(start, pos * self.block_size)
            hi = min(end, (pos + 1) * self.block_size)
            self._slots[block_ids[pos], lo - pos * self.block_size : hi - pos * self.block_size] = data[
                lo - start : hi - start
            ]

    def verify(self, block_ids: Sequence[int], chain: np.ndarray, start: int, end: int) -> Verification:
        """Compare the slots of tokens [start, end) with what that exact prefix must produce."""
        expected = slot_bytes(chain[start:end], self.slot_size)
        bad = []
        for pos in range(start // self.block_size, num_blocks_for(end, self.block_size)):
            lo = max(start, pos * self.block_size)
            hi = min(end, (pos + 1) * self.block_size)
            got = self._slots[block_ids[pos], lo - pos * self.block_size : hi - pos * self.block_size]
            if not np.array_equal(got, expected[lo - start : hi - start]):
                bad.append(pos)
        return Verification(bad)

    def block_address(self, block_id: int) -> int:
        return int(self.buffer.ctypes.data) + block_id * self.block_bytes

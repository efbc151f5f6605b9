"""Memory per conversation and put/take cost of the router's in-memory conversation store (`MemoryStore`) at 10k,
100k and 1M conversations, each size in a fresh subprocess, with decode replies for 32k-token histories (2048 block
ids per entry). Besides the store as written, it measures prototypes of compact entries (the same MemoryStore holding
entries that keep decode's params as bytes) to back a proposed fix.

    python bench/store_bench.py --size N --variant as-written|json-bytes|array-u32|delta-zlib
                                [--params unique|shared] [--ids churned|random] [--blocks 2048] [--ops K]

prints one JSON line. `--params shared` lets entries share their block-id lists (it measures the store's structure
and timing without the block-id payload; used for sizes whose payload would not fit in memory).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import json
import os
import random
import sys
import time
import uuid
import zlib
from array import array
from collections import deque
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np
from duplex_sidecars import protocol
from duplex_sidecars.router.history import Covered, state_key
from duplex_sidecars.router.store import Entry, MemoryStore
from procstat import self_rss_bytes

VARIANTS = ("as-written", "json-bytes", "array-u32", "delta-zlib")
POOL = 64  # distinct decode replies; entries cycle through them
DECODE_URL = "http://10.0.3.17:8000"
TENANT = "anonymous"
MODEL = "meta-llama/Llama-3.1-70B-Instruct"
ENGINE_BLOCKS = 131072  # a decode engine's KV blocks (block ids are below this)


# ---- realistic remote_block_ids -----------------------------------------------------------------------------------

def churned_free_queue(rng: random.Random, num_blocks: int = ENGINE_BLOCKS, ops: int = 20000) -> list[int]:
    """The order of a vLLM-like free block queue after churn: requests take blocks from the head and give them back
    to the tail in reverse order, so the queue holds runs of consecutive ids of mixed lengths."""
    free = deque(range(num_blocks))
    live: list[list[int]] = []
    for _ in range(ops):
        if live and (len(free) < num_blocks // 4 or rng.random() < 0.5):
            blocks = live.pop(rng.randrange(len(live)))
            free.extend(reversed(blocks))
        else:
            n = min(int(rng.expovariate(1 / 96)) + 1, len(free))
            live.append([free.popleft() for _ in range(n)])
    for blocks in live:
        free.extend(reversed(blocks))
    return list(free)


def conversation_block_ids(rng: random.Random, queue: list[int], blocks: int, kind: str) -> list[int]:
    """Block ids of one long conversation on decode: allocated turn by turn (a few hundred blocks each time), each
    allocation a stretch of the free queue; `random` is the worst case (no runs at all)."""
    if kind == "random":
        return rng.sample(range(ENGINE_BLOCKS), blocks)
    out: list[int] = []
    while len(out) < blocks:
        take = min(blocks - len(out), rng.randint(64, 512))
        start = rng.randrange(len(queue) - take)
        out += queue[start:start + take]
    return out


def mean_run(ids: list[int]) -> float:
    """Mean length of runs of consecutive ids (ascending or descending)."""
    runs = 1 + sum(1 for a, b in itertools.pairwise(ids) if abs(b - a) != 1)
    return len(ids) / runs


def decode_reply_params(rng: random.Random, ids: list[int], blocks: int) -> dict[str, Any]:
    """decode's final kv_transfer_params after a turn of a 32k-token conversation (the simulator's shape)."""
    return {
        "do_remote_prefill": False,
        "do_remote_decode": True,
        "remote_block_ids": [ids],
        "remote_engine_id": "decode-5f6c8d9b7-x2k4q",
        "remote_request_id": f"chatcmpl-{uuid.UUID(int=rng.getrandbits(128)).hex}-{rng.getrandbits(32):08x}",
        "remote_host": "10.0.3.17",
        "remote_port": 5600,
        "tp_size": 1,
        "dcp_size": 1,
        "pp_size": 1,
        "remote_num_tokens": blocks * 16 - 7,
        "remote_blocks_expiry_time": 1234567.891011,
        "transfer_mode": "pull",
    }


# ---- compact entries (the proposed fix, prototyped) ---------------------------------------------------------------

def _ids_array(ids: list[int]) -> bytes:
    return array("I", ids).tobytes()


def _ids_from_array(blob: bytes) -> list[int]:
    a = array("I")
    a.frombytes(blob)
    return a.tolist()


def _ids_delta_zlib(ids: list[int]) -> bytes:
    # array() converts a list of ints several times faster than np.asarray().
    absolute = np.frombuffer(array("I", ids), dtype=np.uint32).astype(np.int64)
    return zlib.compress(np.diff(absolute, prepend=0).astype(np.int32).tobytes(), 1)


def _ids_from_delta_zlib(blob: bytes) -> list[int]:
    return np.cumsum(np.frombuffer(zlib.decompress(blob), dtype=np.int32), dtype=np.int64).tolist()


CODECS: dict[str, tuple[Callable[[list[int]], bytes], Callable[[bytes], list[int]]]] = {
    "array-u32": (_ids_array, _ids_from_array),
    "delta-zlib": (_ids_delta_zlib, _ids_from_delta_zlib),
}


class CompactEntry:
    """What MemoryStore needs of an entry (decode_url, expires_at, expired, params, tombstone), with everything
    else kept as bytes: compact JSON of the params without the block ids, plus the block ids in a codec (or, for
    `json-bytes`, the whole entry as JSON bytes)."""

    __slots__ = ("_codec", "_ids", "_meta", "decode_url", "expired", "expires_at", "reason")

    def __init__(self, decode_url: str, codec: str, params: dict[str, Any] | None, covered: Covered | None,
                 scope: str | None, reason: str | None = None):
        self.decode_url = decode_url
        self.expires_at = 0.0
        self.expired = False
        self.reason = reason
        self._codec = codec
        self._ids: bytes | None = None
        if params is None:
            self._meta = None
            return
        cov = [covered.kind, covered.digest, covered.length] if covered else None
        if codec == "json-bytes":
            self._meta = json.dumps([params, cov, scope], separators=(",", ":")).encode()
            return
        rest = {k: v for k, v in params.items() if k != "remote_block_ids"}
        groups = params["remote_block_ids"]
        flat = groups[0] if groups and isinstance(groups[0], list) else groups
        self._meta = json.dumps([rest, cov, scope, len(groups) if flat is not groups else 0],
                                separators=(",", ":")).encode()
        self._ids = CODECS[codec][0](flat)

    def _decoded(self) -> tuple[dict[str, Any], list[Any], str]:
        assert self._meta is not None
        if self._codec == "json-bytes":
            params, cov, scope = json.loads(self._meta)
            return params, cov, scope
        params, cov, scope, grouped = json.loads(self._meta)
        assert self._ids is not None
        ids = CODECS[self._codec][1](self._ids)
        params["remote_block_ids"] = [ids] if grouped else ids
        return params, cov, scope

    @property
    def params(self) -> dict[str, Any] | None:
        return None if self._meta is None else self._decoded()[0]

    def copy(self) -> CompactEntry:
        """An equal entry with its own bytes objects (fills large stores without re-encoding every entry)."""
        twin = CompactEntry(self.decode_url, self._codec, None, None, None, self.reason)
        twin._meta = bytes(memoryview(self._meta)) if self._meta is not None else None
        twin._ids = bytes(memoryview(self._ids)) if self._ids is not None else None
        return twin

    def tombstone(self, reason: str) -> CompactEntry:
        tomb = CompactEntry(self.decode_url, self._codec, None, None, None, reason)
        tomb.expires_at = self.expires_at
        return tomb


# ---- the measurement ----------------------------------------------------------------------------------------------

def _digest(i: int, salt: str) -> str:
    return uuid.uuid5(uuid.NAMESPACE_OID, f"{salt}{i}").hex * 2  # 64 hex characters, like a SHA-256 hexdigest


def _digests(i: int) -> tuple[Covered, str]:
    return Covered("messages", _digest(i, "covered"), 41), _digest(i, "scope")


def _make_entry(variant: str, params: dict[str, Any], covered: Covered, scope: str) -> Any:
    """What reuse.record stores for a decode reply: the allow-listed params, the covered history and the scope."""
    replayable = protocol.replayable_decode_params(params)
    if variant == "as-written":
        return Entry(decode_url=DECODE_URL, params=replayable, covered=covered, scope=scope)
    return CompactEntry(DECODE_URL, variant, replayable, covered, scope)


async def measure(variant: str, size: int, params_mode: str, ids_kind: str, blocks: int, ops: int) -> dict[str, Any]:
    rng = random.Random(1234)
    queue = churned_free_queue(rng)
    pool_ids = [conversation_block_ids(rng, queue, blocks, ids_kind) for _ in range(POOL)]
    pool_text = [json.dumps(decode_reply_params(rng, ids, blocks)) for ids in pool_ids]
    pool_parsed = [json.loads(t) for t in pool_text]
    # The router's entries come from json.loads of decode's reply, so each holds its own int objects.
    unique = variant == "as-written" and params_mode == "unique"
    if variant == "as-written":
        source = (lambda i: json.loads(pool_text[i % POOL])) if unique else (lambda i: pool_parsed[i % POOL])
        make = lambda i: _make_entry(variant, source(i), *_digests(i))
    else:
        # Encoding costs 30-150 us per entry: encode the pool once and give every entry copies of its bytes
        # (the same sizes); put/take below time the full encode and decode.
        encoded = [_make_entry(variant, pool_parsed[j], *_digests(j)) for j in range(POOL)]
        make = lambda i: encoded[i % POOL].copy()
    store = MemoryStore(max_entries=size + ops + 1)
    ttl = 3600.0

    gc.collect()
    rss0 = self_rss_bytes()
    t0 = time.perf_counter()
    for i in range(size):
        await store.put(state_key(TENANT, MODEL, f"conv-{i}"), make(i), ttl)
    fill_s = time.perf_counter() - t0
    gc.collect()
    rss1 = self_rss_bytes()
    payload_sample = (sys.getsizeof(_make_entry(variant, pool_parsed[0], *_digests(0))._meta)
                      if variant != "as-written" else None)

    # Steady-state cost at this size: take existing conversations, put new ones (the store stays near `size`).
    ops = min(ops, size)
    take_keys = [state_key(TENANT, MODEL, f"conv-{i}") for i in rng.sample(range(size), ops)]
    put_keys = [state_key(TENANT, MODEL, f"new-{i}") for i in range(ops)]
    put_digests = [_digests(size + i) for i in range(ops)]
    t0 = time.perf_counter()
    hits = 0
    for key in take_keys:
        entry = await store.take(key)
        params = entry.params if entry is not None else None
        if params is not None:
            protocol.replay_params(params)
            hits += 1
    take_us = (time.perf_counter() - t0) / ops * 1e6
    t0 = time.perf_counter()
    for i, key in enumerate(put_keys):
        await store.put(key, _make_entry(variant, pool_parsed[i % POOL], *put_digests[i]), ttl)
    put_us = (time.perf_counter() - t0) / ops * 1e6
    assert hits == ops, f"only {hits} of {ops} takes found their entry"
    return {
        "variant": variant,
        "size": size,
        "params": "unique" if unique else "shared",
        "ids": ids_kind,
        "blocks": blocks,
        "mean_run": round(sum(mean_run(ids) for ids in pool_ids) / POOL, 1),
        "rss_delta_bytes": rss1 - rss0,
        "bytes_per_conversation": round((rss1 - rss0) / size, 1),
        "fill_seconds": round(fill_s, 2),
        "put_us": round(put_us, 2),
        "take_us": round(take_us, 2),
        "ops": ops,
        "meta_bytes_sample": payload_sample,
        "ids_bytes_sample": (len(CODECS[variant][0](pool_ids[0])) if variant in CODECS else None),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", type=int, required=True)
    p.add_argument("--variant", choices=VARIANTS, default="as-written")
    p.add_argument("--params", choices=("unique", "shared"), default="unique")
    p.add_argument("--ids", choices=("churned", "random"), default="churned")
    p.add_argument("--blocks", type=int, default=2048)
    p.add_argument("--ops", type=int, default=20000)
    args = p.parse_args(argv)
    result = asyncio.run(measure(args.variant, args.size, args.params, args.ids, args.blocks, args.ops))
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

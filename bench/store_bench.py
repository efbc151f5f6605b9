"""Memory per conversation and put/take cost of the router's conversation store (`MemoryStore` holding the router's
compact `Entry`, built the way `reuse.record` builds it) at 10k, 100k and 1M conversations, each size in a fresh
subprocess, with decode replies for 32k-token histories (2048 block ids per entry).

    python bench/store_bench.py [--sizes 10000,100000,1000000] [--out bench/results]

runs every measurement (a few minutes; 1M conversations take 1-3 min each) and writes `store-<date>.md` and `.json`;

    python bench/store_bench.py --size N [--variant as-written|json-bytes|array-u32|delta-zlib]
                                [--ids churned|random] [--bounded] [--blocks 2048] [--ops K]

runs one measurement and prints one JSON line (what `router_bench.py` calls). `as-written` is the router's store;
the others are the prototypes that preceded it (objects in a stand-in for the store they were first measured in).
`--bounded` keeps the store's default bounds (`store.max_entries`, `store.max_bytes`) instead of lifting them, to
show what the byte bound holds; `--freeze` calls `gc.freeze()` once the store exists.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import gc
import itertools
import json
import os
import random
import shlex
import subprocess
import sys
import time
import uuid
import zlib
from array import array
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import procstat
import results_io

from duplex_sidecars import protocol
from duplex_sidecars.router.config import StoreConfig
from duplex_sidecars.router.history import Covered, state_key
from duplex_sidecars.router.store import ENTRY_OVERHEAD_BYTES, Entry, MemoryStore, pack_params, unpack_params

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GIB = 2**30

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
        out += queue[start : start + take]
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


# ---- the prototypes that preceded the router's compact entry ---------------------------------------------------------------


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
    nbytes = 0  # the prototypes do not count against the store's byte bound

    def __init__(
        self,
        decode_url: str,
        codec: str,
        params: dict[str, Any] | None,
        covered: Covered | None,
        scope: str | None,
        reason: str | None = None,
    ):
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
        self._meta = json.dumps(
            [rest, cov, scope, len(groups) if flat is not groups else 0], separators=(",", ":")
        ).encode()
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

    @property
    def replayable(self) -> bool:
        return self._meta is not None

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


class PrototypeStore:
    """What MemoryStore was when the prototypes were measured: entry objects in an insertion-ordered dict plus an
    index by endpoint, swept oldest first (the router's store now keeps rows of its own Entry, which the prototypes
    are not)."""

    def __init__(self) -> None:
        self._entries: OrderedDict[str, CompactEntry] = OrderedDict()
        self._by_endpoint: dict[str, set[str]] = {}

    async def put(self, key: str, entry: CompactEntry, ttl: float) -> int:
        entry.expires_at = time.monotonic() + ttl
        old = self._entries.pop(key, None)
        if old is not None:
            self._by_endpoint[old.decode_url].discard(key)
        self._entries[key] = entry
        self._by_endpoint.setdefault(entry.decode_url, set()).add(key)
        return 0

    async def take(self, key: str) -> CompactEntry | None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._by_endpoint[entry.decode_url].discard(key)
        return entry

    async def size(self) -> int:
        return len(self._entries)


# ---- one measurement ----------------------------------------------------------------------------------------------


def _digest(i: int, salt: str) -> str:
    return uuid.uuid5(uuid.NAMESPACE_OID, f"{salt}{i}").hex * 2  # 64 hex characters, like a SHA-256 hexdigest


def _digests(i: int) -> tuple[Covered, str]:
    return Covered("messages", _digest(i, "covered"), 41), _digest(i, "scope")


def _reply(pool: list[dict[str, Any]], i: int) -> dict[str, Any]:
    """Conversation i's decode reply: one of the pool's block-id lists, its own request id."""
    return {**pool[i % POOL], "remote_request_id": f"chatcmpl-{i:032x}-{i & 0xFFFFFFFF:08x}"}


def _make_entry(variant: str, params: dict[str, Any], covered: Covered, scope: str) -> Any:
    """What reuse.record stores for a decode reply: the allow-listed params, the covered history and the scope."""
    replayable = protocol.replayable_decode_params(params)
    if variant == "as-written":
        return Entry(decode_url=DECODE_URL, params=replayable, covered=covered, scope=scope)
    return CompactEntry(DECODE_URL, variant, replayable, covered, scope)


def _us(samples_ns: list[int]) -> tuple[float, float]:
    a = np.asarray(samples_ns) / 1000
    return round(float(a.mean()), 2), round(float(np.percentile(a, 99)), 2)


async def measure(
    variant: str, size: int, ids_kind: str, blocks: int, ops: int, bounded: bool, freeze: bool
) -> dict[str, Any]:
    rng = random.Random(1234)
    queue = churned_free_queue(rng)
    pool_ids = [conversation_block_ids(rng, queue, blocks, ids_kind) for _ in range(POOL)]
    # decode's params as the router gets them: parsed from JSON, every entry's ints its own objects.
    pool = [json.loads(json.dumps(decode_reply_params(rng, ids, blocks))) for ids in pool_ids]
    if variant == "as-written":

        def make(i):
            return _make_entry(variant, _reply(pool, i), *_digests(i))
    else:
        # The prototypes encode in 30-150 us per entry: encode the pool once and give every entry copies of its
        # bytes (the same sizes); put/take below time the full encode and decode.
        encoded = [_make_entry(variant, pool[j], *_digests(j)) for j in range(POOL)]

        def make(i):
            return encoded[i % POOL].copy()

    defaults = StoreConfig()
    store: Any
    if variant != "as-written":
        store = PrototypeStore()
    elif bounded:
        store = MemoryStore(defaults.max_entries, defaults.max_bytes)
    else:
        store = MemoryStore(max_entries=size + ops + 1, max_bytes=2**62)
    ttl = 3600.0
    keys = [state_key(TENANT, MODEL, f"conv-{i}") for i in range(size)]

    gc.collect()
    if freeze:
        gc.freeze()  # what a router could do once its store exists: full collections then skip the store's dict
    t0 = time.perf_counter()
    gc.collect()
    gc_empty_ms = (time.perf_counter() - t0) * 1000
    rss0 = procstat.self_rss_bytes()
    t0 = time.perf_counter()
    evicted = 0
    for i, key in enumerate(keys):
        evicted += await store.put(key, make(i), ttl)
    fill_s = time.perf_counter() - t0
    del keys
    gc.collect()
    rss1 = procstat.self_rss_bytes()
    # A full collection's pause with this many entries held (the first one above also untracked the new rows).
    t0 = time.perf_counter()
    gc.collect()
    gc_ms = (time.perf_counter() - t0) * 1000
    held = await store.size()
    sample = [_make_entry(variant, _reply(pool, i), *_digests(i)) for i in range(POOL)]

    # Steady state at this size: take held conversations (every take a hit, decoded and turned into the prefill
    # leg's params), put new ones (the store stays near `size`, or at its bound).
    ops = min(ops, held)
    held_from = size - held  # evictions are oldest first: conv-0 .. conv-(size-held-1) are gone
    take_keys = [state_key(TENANT, MODEL, f"conv-{i}") for i in rng.sample(range(held_from, size), ops)]
    put_args = [(state_key(TENANT, MODEL, f"new-{i}"), _digests(size + i)) for i in range(ops)]
    take_ns, put_ns = [], []
    hits = 0
    clock = time.perf_counter_ns
    for key in take_keys:
        t = clock()
        entry = await store.take(key)
        params = entry.params if entry is not None else None
        if params is not None:
            protocol.replay_params(params)
        take_ns.append(clock() - t)
        hits += params is not None
    for i, (key, (covered, scope)) in enumerate(put_args):
        reply = _reply(pool, size + i)
        t = clock()
        evicted += await store.put(key, _make_entry(variant, reply, covered, scope), ttl)
        put_ns.append(clock() - t)
    assert hits == ops, f"only {hits} of {ops} takes found their entry"

    # The codec alone, on the pool (the router's entry only).
    pack_ns, unpack_ns = [], []
    if variant == "as-written":
        for i in range(min(ops, 2000)):
            replayable = protocol.replayable_decode_params(_reply(pool, i))
            t = clock()
            blob = pack_params(replayable)
            pack_ns.append(clock() - t)
            t = clock()
            unpack_params(blob)
            unpack_ns.append(clock() - t)

    put_us, put_p99 = _us(put_ns)
    take_us, take_p99 = _us(take_ns)
    return {
        "variant": variant,
        "size": size,
        "held": held,
        "evicted": evicted,
        "bounded": bounded,
        "frozen": freeze,
        "max_entries": store.max_entries if bounded and variant == "as-written" else None,
        "max_bytes": store.max_bytes if bounded and variant == "as-written" else None,
        "params": "packed" if variant == "as-written" else "shared",
        "ids": ids_kind,
        "blocks": blocks,
        "mean_run": round(sum(mean_run(ids) for ids in pool_ids) / POOL, 1),
        "rss_delta_bytes": rss1 - rss0,
        "bytes_per_conversation": round((rss1 - rss0) / held, 1),
        "counted_bytes_per_conversation": round(store.bytes_held() / held, 1) if variant == "as-written" else None,
        "entry_overhead_bytes": ENTRY_OVERHEAD_BYTES,
        "blob_bytes": (round(sum(len(e.blob) for e in sample) / POOL, 1) if variant == "as-written" else None),
        "redis_value_bytes": (
            round(sum(len(e.to_bytes()) for e in sample) / POOL, 1) if variant == "as-written" else None
        ),
        "fill_seconds": round(fill_s, 2),
        "full_gc_ms": round(gc_ms, 1),
        "full_gc_empty_ms": round(gc_empty_ms, 1),
        "put_us": put_us,
        "put_p99_us": put_p99,
        "take_us": take_us,
        "take_p99_us": take_p99,
        "pack_us": _us(pack_ns)[0] if pack_ns else None,
        "unpack_us": _us(unpack_ns)[0] if unpack_ns else None,
        "ops": ops,
        "meta_bytes_sample": sys.getsizeof(sample[0]._meta) if variant != "as-written" else None,
        "ids_bytes_sample": (len(CODECS[variant][0](pool_ids[0])) if variant in CODECS else None),
    }


# ---- the whole run ------------------------------------------------------------------------------------------------


def _one(size: int, ids: str, bounded: bool, freeze: bool, blocks: int, ops: int) -> dict[str, Any]:
    cmd = (
        [
            sys.executable,
            os.path.abspath(__file__),
            "--size",
            str(size),
            "--ids",
            ids,
            "--blocks",
            str(blocks),
            "--ops",
            str(ops),
        ]
        + (["--bounded"] if bounded else [])
        + (["--freeze"] if freeze else [])
    )
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{shlex.join(cmd)} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def plan(sizes: list[int]) -> list[tuple[int, str, bool, bool]]:
    """(size, ids, bounded, frozen) per measurement: realistic ids at every size with the bounds lifted (what a
    conversation costs); ids without runs (the codec's worst case) likewise but for the largest size, which runs,
    like the realistic ids, under the default bounds, to show what they hold; and the largest size once more with
    the store frozen (`gc.freeze()`), for the full collection's pause."""
    largest = max(sizes)
    rows = [(size, "churned", False, False) for size in sizes]
    rows += [(size, "random", False, False) for size in sizes if size < largest]
    return rows + [
        (largest, "churned", True, False),
        (largest, "random", True, False),
        (largest, "churned", False, True),
    ]


def run_all(args: argparse.Namespace) -> dict[str, Any]:
    started = dt.datetime.now(dt.UTC)
    exe = os.path.relpath(sys.executable, ROOT)
    meta = {
        "command": shlex.join([exe if not exe.startswith("..") else sys.executable, *sys.argv]),
        "started_utc": started.isoformat(timespec="seconds"),
        "machine": procstat.machine_facts(ROOT),
        "loadavg_start": os.getloadavg(),
    }
    results = []
    for size, ids, bounded, freeze in plan(args.sizes):
        # Unbounded rows with ids that do not compress would take ~7 KB per conversation.
        estimate = size * (7_500 if ids == "random" and not bounded else 2_500)
        if estimate > 0.6 * procstat.mem_available_bytes():
            print(f"store: {size:,} {ids} skipped: ~{estimate / GIB:.1f} GiB would not fit", file=sys.stderr)
            continue
        label = (
            f"{size:>9,} conversations, {ids} ids"
            + (", default bounds" if bounded else "")
            + (", store frozen" if freeze else "")
        )
        print(f"store: {label} ...", file=sys.stderr, flush=True)
        r = _one(size, ids, bounded, freeze, args.blocks, args.ops)
        print(
            f"store: {label} -> held {r['held']:,}, {r['bytes_per_conversation']:,.0f} B/conversation (counted "
            f"{r['counted_bytes_per_conversation']:,.0f}), put {r['put_us']:.1f} us, take {r['take_us']:.1f} us, "
            f"fill {r['fill_seconds']} s, full GC {r['full_gc_ms']} ms",
            file=sys.stderr,
            flush=True,
        )
        results.append(r)
    meta["finished_utc"] = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    meta["loadavg_end"] = os.getloadavg()
    return {"meta": meta, "results": results}


def markdown(run: dict[str, Any]) -> str:
    meta, m = run["meta"], run["meta"]["machine"]
    rows = run["results"]
    lines = [
        f"# Conversation store benchmark {meta['started_utc'][:10]}",
        "",
        f"Command: `{meta['command']}`",
        "",
        *([meta["note"], ""] if meta.get("note") else []),
        f"- Started {meta['started_utc']}, finished {meta['finished_utc']} (UTC)",
        f"- Machine: nproc {m['nproc']} ({m['cpus_usable']} usable), {m['cpu_model']}, {m['mem_total_gib']} GiB, "
        f"kernel {m['kernel']}",
        f"- Python {m['python']}, duplex commit {m['git_commit']}"
        + (" (with uncommitted changes under sidecars/)" if m.get("sidecars_dirty") else ""),
        f"- Load average at start {meta['loadavg_start'][0]:.2f}, at end {meta['loadavg_end'][0]:.2f} (the machine "
        f"is shared)",
        "",
        "The router's `MemoryStore` holding entries as `reuse.record` builds them (`Entry(params=...)`: decode's "
        "params packed into one blob), for decode replies after a 32k-token history: "
        f"{rows[0]['blocks'] if rows else 2048} block ids in one KV-cache group (block size 16). One fresh "
        "subprocess per row. *bytes / conversation* = RSS growth over the fill / conversations held; *counted* = "
        "what the store counts against `store.max_bytes` (blob + "
        f"{rows[0]['entry_overhead_bytes'] if rows else ENTRY_OVERHEAD_BYTES} B per entry); *blob* and *Redis "
        "value* = mean sizes (the Redis value is the blob behind a small header). *put* = build the entry from "
        "decode's parsed params (packing included) + `MemoryStore.put`; *take* = `MemoryStore.take` + unpacking + "
        "the prefill leg's replay params; both per operation at steady state at that size (mean and p99). "
        "*pack*/*unpack* = the codec alone. *full GC* = one `gc.collect()` with the store empty -> full (the "
        "benchmark's own objects take the first); *frozen*: "
        "`gc.freeze()` once the (empty) store exists, as a router could at startup. Block ids: *churned* = stretches of a simulated vLLM free-block queue "
        "after churn (runs of consecutive ids); *random* = no runs at all, the codec's worst case.",
        "",
        "| conversations offered | held | bounds | block ids | bytes / conversation | counted | total GiB (RSS) | "
        "blob B | Redis value B | put us (p99) | take us (p99) | pack us | unpack us | full GC ms | fill s |",
        "|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        bounds = (
            f"default ({r['max_entries']:,} entries, {r['max_bytes'] / GIB:g} GiB); {r['evicted']:,} "
            f"evicted (fill and steady state)"
            if r["bounded"]
            else "lifted"
        )
        bounds += "; frozen" if r.get("frozen") else ""
        lines.append(
            f"| {r['size']:,} | {r['held']:,} | {bounds} | {r['ids']} (mean run {r['mean_run']}) | "
            f"{r['bytes_per_conversation']:,.0f} | {r['counted_bytes_per_conversation']:,.0f} | "
            f"{r['rss_delta_bytes'] / GIB:.2f} | {r['blob_bytes']:,.0f} | {r['redis_value_bytes']:,.0f} | "
            f"{r['put_us']:.1f} ({r['put_p99_us']:.0f}) | {r['take_us']:.1f} ({r['take_p99_us']:.0f}) | "
            f"{r['pack_us']:.1f} | {r['unpack_us']:.1f} | {r['full_gc_empty_ms']:.0f} -> {r['full_gc_ms']:.0f} | "
            f"{r['fill_seconds']:.1f} |"
        )
    million = [
        r for r in rows if r["size"] >= 1_000_000 and r["ids"] == "churned" and not r["bounded"] and not r["frozen"]
    ]
    if million:
        r = million[0]
        total = r["bytes_per_conversation"] * 1_000_000 / GIB
        verdict = "PASS" if total < 2 else "FAIL"
        lines += [
            "",
            f"Target: 1M conversations with 32k-token histories under 2 GiB: {total:.2f} GiB "
            f"({r['bytes_per_conversation']:,.0f} B / conversation, realistic ids): **{verdict}**.",
        ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", type=int, help="one measurement at this many conversations (prints one JSON line)")
    p.add_argument("--sizes", default="10000,100000,1000000", help="the whole run's sizes")
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "results"), help="where the whole run writes")
    p.add_argument("--variant", choices=VARIANTS, default="as-written")
    p.add_argument(
        "--params",
        choices=("unique", "shared"),
        default="unique",
        help="accepted for router_bench.py; the router's entries never share their params",
    )
    p.add_argument("--ids", choices=("churned", "random"), default="churned")
    p.add_argument("--bounded", action="store_true", help="keep the store's default bounds")
    p.add_argument("--freeze", action="store_true", help="gc.freeze() once the store exists")
    p.add_argument("--blocks", type=int, default=2048)
    p.add_argument("--ops", type=int, default=20000)
    args = p.parse_args(argv)
    if args.size is not None:
        result = asyncio.run(
            measure(args.variant, args.size, args.ids, args.blocks, args.ops, args.bounded, args.freeze)
        )
        print(json.dumps(result), flush=True)
        return 0
    args.sizes = [int(x) for x in args.sizes.split(",")]
    run = run_all(args)
    stem = os.path.join(args.out, f"store-{run['meta']['started_utc'][:10]}")
    results_io.write(stem, run, markdown(run))
    print(f"wrote {stem}.md and {stem}.json", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

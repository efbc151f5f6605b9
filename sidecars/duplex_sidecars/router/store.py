"""Where decode's retained-block metadata waits for a conversation's next turn: in memory or in Redis.

Entries are single-use (an atomic take), live for the router TTL, and become tombstones when the decode endpoint
holding their blocks leaves. An entry stays readable for a short grace after it expires so that a late turn is
counted as `expired` rather than `no_entry`; it is never replayed then.

An entry keeps decode's params as one compact, immutable blob (block ids as zlib-compressed int32 deltas), decoded
only when a hit replays them: a 32k-token history's 2048 block ids as Python ints would cost ~85 KB per conversation.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import hmac
import json
import logging
import os
import time
import zlib
from array import array
from collections import OrderedDict
from collections.abc import Callable
from itertools import accumulate, chain
from typing import Any, Final, Literal, Protocol, cast

import numpy as np
import orjson

from duplex_sidecars.router.config import StoreConfig
from duplex_sidecars.router.history import Covered

log = logging.getLogger(__name__)

# How long past its TTL an entry is kept around (as a known-expired marker) before it is deleted.
EXPIRED_GRACE_SECONDS = 60.0

ENDPOINT_GONE = "endpoint_gone"
MAC_BYTES = 16  # of HMAC-SHA256, before each sealed Redis value
DROP_BATCH = 1000  # keys of an endpoint's Redis index read per round trip when it is dropped
NOT_REPLAYABLE = "not_replayable"

# What an entry costs in the memory store besides its blob: the key, its row, two digests, the slots in the store's
# dict and endpoint index. bench/store_bench.py measured ~560 B (RSS growth minus blobs at 1M entries); the byte
# bound counts this.
ENTRY_OVERHEAD_BYTES = 600


class StoreError(Exception):
    """The store could not answer (or answered something undecodable); the request recomputes."""


# ---- the compact form of decode's params -----------------------------------------------------------------------

_IDS_KEY = "remote_block_ids"
_ID_LIMIT = 2**31  # ids in [0, 2**31) have int32 deltas
_ORJSON, _STDJSON = b"o", b"j"
_INTEGER_LISTS = b"0123456789,[]"
# Short lists (a few turns of history) are packed and unpacked without numpy, whose per-call cost dominates them, and
# small payloads are kept uncompressed behind a tag byte (a zlib stream starts with 0x78): setting up deflate costs
# more than a few hundred bytes are worth.
_SMALL_IDS = 48
_RAW = b"\x00"
_COMPRESS_FROM = 512


def _dump(value: Any) -> bytes:
    """JSON text behind a one-byte tag. orjson when it gives the value back exactly; otherwise (ints beyond 64 bits,
    lone surrogates, NaN) the standard library, which does."""
    try:
        text = orjson.dumps(value)
        if orjson.loads(text) == value:
            return _ORJSON + text
    except (TypeError, ValueError):
        pass
    return _STDJSON + json.dumps(value, separators=(",", ":")).encode()


def _load(data: bytes | memoryview) -> Any:
    tag, text = bytes(data[:1]), data[1:]
    if tag == _ORJSON:
        return orjson.loads(text)
    if tag == _STDJSON:
        return json.loads(bytes(text))
    raise ValueError(f"unknown JSON tag {tag!r}")


def _pack_block_ids(block_ids: Any) -> tuple[int | list[int], bytes] | None:
    """(shape, int32 deltas) for a flat list or a list per KV-cache group of ids in [0, 2**31); the shape is the
    flat list's length or the groups' lengths. None for anything else, which is then kept verbatim."""
    if type(block_ids) is not list:
        return None
    grouped = all(type(g) is list for g in block_ids)
    groups = block_ids if grouped else [block_ids]
    try:
        # array() rejects what is not an int in [0, 2**32) (floats, None, strings, lists) but takes bools as 0 and
        # 1; orjson spells them out.
        text = orjson.dumps(groups)
        if text.translate(None, _INTEGER_LISTS):
            return None
        flat = array("I")
        for group in groups:
            flat.fromlist(group)
    except (TypeError, OverflowError):
        return None
    shape = [len(g) for g in groups] if grouped else len(block_ids)
    if len(flat) <= _SMALL_IDS:
        if flat and max(flat) >= _ID_LIMIT:
            return None
        small = array(
            "i", [b - a for a, b in zip(chain((0,), flat), flat, strict=False)]
        )  # |delta| < 2**31: int32 holds it
        return shape, small.tobytes()
    ids = np.frombuffer(flat, dtype=np.uint32)
    if int(ids.max()) >= _ID_LIMIT:
        return None
    ids = ids.view(np.int32)
    deltas = np.empty_like(ids)
    deltas[:1] = ids[:1]
    np.subtract(ids[1:], ids[:-1], out=deltas[1:])
    return shape, deltas.tobytes()


def pack_params(params: dict[str, Any]) -> bytes:
    """decode's params as one blob: a 4-byte length, the block-id deltas, then JSON of [position of remote_block_ids
    among the keys, their shape, the other params] (shape null: nothing was packed and the params are all in the
    JSON); zlib-compressed, or behind a zero byte when that is under `_COMPRESS_FROM` bytes."""
    packed = _pack_block_ids(params[_IDS_KEY]) if _IDS_KEY in params else None
    head: list[Any]
    if packed is None:
        head, deltas = [None, None, params], b""
    else:
        shape, deltas = packed
        rest = {k: v for k, v in params.items() if k != _IDS_KEY}
        head = [list(params).index(_IDS_KEY), shape, rest]
    payload = len(deltas).to_bytes(4, "little") + deltas + _dump(head)
    return _RAW + payload if len(payload) < _COMPRESS_FROM else zlib.compress(payload, 1)


def unpack_params(blob: bytes) -> dict[str, Any]:
    """The params `pack_params` packed, equal to them (same keys in the same order, same types and values)."""
    try:
        raw = blob[1:] if blob[:1] == _RAW else zlib.decompress(blob)
        size = int.from_bytes(raw[:4], "little")
        params: dict[str, Any]
        position, shape, params = _load(memoryview(raw)[4 + size :])
        if shape is None:
            return params
        # Partial sums of the deltas are the ids themselves, so int32 cannot overflow.
        if size % 4 or 4 + size > len(raw):
            raise ValueError(f"{size} bytes of block-id deltas")
        if size // 4 <= _SMALL_IDS:
            deltas = array("i")
            deltas.frombytes(raw[4 : 4 + size])
            ids = list(accumulate(deltas))
        else:
            ids = np.cumsum(np.frombuffer(raw, dtype=np.int32, count=size // 4, offset=4), dtype=np.int32).tolist()
        if (shape if isinstance(shape, int) else sum(shape)) != len(ids):
            raise ValueError(f"{len(ids)} block ids for shape {shape}")
        if isinstance(shape, int):
            block_ids: list[Any] = ids
        else:
            block_ids, start = [], 0
            for length in shape:
                block_ids.append(ids[start : start + length])
                start += length
        items = list(params.items())
        items.insert(position, (_IDS_KEY, block_ids))
        return dict(items)
    except (zlib.error, ValueError, TypeError) as exc:
        raise StoreError(f"undecodable entry: {type(exc).__name__}: {exc}") from exc


# ---- entries --------------------------------------------------------------------------------------------------------

_ENTRY_FORMAT = b"\x01"

# An entry as plain values: (decode_url, reason, covered kind, digest, length, scope, expires_at, blob, prefill_url).
Row = tuple[
    str,
    str | None,
    Literal["messages", "text"] | None,
    str | None,
    int | None,
    str | None,
    float,
    bytes | None,
    str | None,
]
_URL: Final = 0
_EXPIRES_AT: Final = 6
_BLOB: Final = 7
_PREFILL: Final = 8


def _row_bytes(row: Row) -> int:
    """What a row counts against the memory store's byte bound."""
    blob = row[_BLOB]
    return ENTRY_OVERHEAD_BYTES + (len(blob) if blob is not None else 0)


class Entry:
    """One conversation's stored decode reply, or a tombstone (no params) saying why there is nothing to replay.

    The params are packed when the entry is made and unpacked by each read of `params`; `replayable` tells without
    unpacking."""

    __slots__ = (
        "blob",
        "covered",
        "decode_url",
        "expires_at",
        "prefill_url",
        "reason",
        "remaining",
        "scope",
    )

    def __init__(
        self,
        decode_url: str,
        params: dict[str, Any] | None = None,
        reason: str | None = None,
        covered: Covered | None = None,
        scope: str | None = None,
        expires_at: float = 0.0,
        *,
        blob: bytes | None = None,
        prefill_url: str | None = None,
    ):
        self.decode_url = decode_url
        self.prefill_url = prefill_url  # the prefill engine of the turn: its prefix cache may still hold the prompt
        self.blob = pack_params(params) if params is not None else blob
        self.reason = reason  # tombstone reason
        self.covered = covered
        self.scope = scope
        self.expires_at = expires_at
        self.remaining: float | None = None  # seconds of its TTL left when taken (negative: past it); set by take()

    @property
    def expired(self) -> bool:
        """Taken after its TTL (within the grace that keeps it readable): counted as expired, never replayed."""
        return self.remaining is not None and self.remaining <= 0

    @property
    def replayable(self) -> bool:
        return self.blob is not None

    @property
    def params(self) -> dict[str, Any] | None:
        """decode's stored params (a fresh dict on every read), None for a tombstone; StoreError if undecodable."""
        return None if self.blob is None else unpack_params(self.blob)

    @property
    def nbytes(self) -> int:
        """What this entry is counted as in the memory store's byte bound."""
        return _row_bytes(self.to_row())

    def tombstone(self, reason: str) -> Entry:
        return Entry(
            decode_url=self.decode_url, reason=reason, expires_at=self.expires_at, prefill_url=self.prefill_url
        )

    def to_row(self) -> Row:
        cov = self.covered
        return (
            self.decode_url,
            self.reason,
            cov.kind if cov else None,
            cov.digest if cov else None,
            cov.length if cov else None,
            self.scope,
            self.expires_at,
            self.blob,
            self.prefill_url,
        )

    @classmethod
    def from_row(cls, row: Row) -> Entry:
        url, reason, kind, digest, length, scope, expires_at, blob, prefill = row
        covered = None
        if kind is not None:  # to_row writes kind, digest and length from one Covered: all three or none
            covered = Covered(kind=kind, digest=cast(str, digest), length=cast(int, length))
        return cls(
            decode_url=url,
            reason=reason,
            covered=covered,
            scope=scope,
            expires_at=expires_at,
            blob=blob,
            prefill_url=prefill,
        )

    def to_bytes(self) -> bytes:
        """The Redis value: a format byte, the metadata's length and JSON, then the params blob as is."""
        row = self.to_row()
        meta = _dump([*row[:_BLOB], row[_PREFILL]])
        return _ENTRY_FORMAT + len(meta).to_bytes(4, "little") + meta + (self.blob or b"")

    @classmethod
    def from_bytes(cls, raw: bytes) -> Entry:
        """The entry `to_bytes` wrote; StoreError if `raw` is not one. The params stay packed."""
        try:
            if raw[:1] != _ENTRY_FORMAT:
                raise ValueError(f"unknown entry format {raw[:1]!r}")
            size = int.from_bytes(raw[1:5], "little")
            meta = _load(memoryview(raw)[5 : 5 + size])
            if len(meta) == 7:  # written before entries named their prefill engine
                meta.append(None)
            url, reason, kind, digest, length, scope, expires_at, prefill = meta
            blob = raw[5 + size :] or None
            return cls.from_row((url, reason, kind, digest, length, scope, float(expires_at), blob, prefill))
        except (ValueError, TypeError) as exc:
            raise StoreError(f"undecodable entry: {type(exc).__name__}: {exc}") from exc

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Entry):
            return NotImplemented
        return all(getattr(self, name) == getattr(other, name) for name in self.__slots__)

    def __repr__(self) -> str:
        size = len(self.blob) if self.blob is not None else None
        return (
            f"Entry(decode_url={self.decode_url!r}, blob={size} bytes, reason={self.reason!r}, "
            f"covered={self.covered!r}, scope={self.scope!r}, expires_at={self.expires_at!r}, "
            f"expired={self.expired!r})"
        )


class Store(Protocol):
    kind: str
    # True when put and take never suspend (no I/O): an entry can then be stored right after the client's answer is
    # written, with nothing else running in between.
    immediate: bool

    async def put(self, key: str, entry: Entry, ttl: float) -> int:
        """Store `entry` under `key`; returns how many other entries were evicted to stay within the bounds."""
        ...

    async def take(self, key: str) -> Entry | None: ...

    async def drop_endpoint(self, url: str) -> int: ...

    async def held(self, url: str, remaining: float = 0.0) -> int:
        """Live bindings to the decode engine at `url`: replayable entries, not expired, that a next turn may still
        read from it (a draining pod waits for them). `remaining`: only those with more than this many seconds of
        their TTL left, i.e. stored recently (an entry's TTL is the router's, the same for all)."""
        ...

    async def size(self) -> int | None: ...

    def bytes_held(self) -> int | None:
        """Bytes the entries are counted as in this process; None when they are held elsewhere."""
        ...

    def bytes_bound(self) -> int | None:
        """The bound `bytes_held` is kept under; None when the entries are held elsewhere."""
        ...

    def set_bounds(self, max_entries: int, max_bytes: int) -> None:
        """Bound what this process holds (on a reload); a store that holds its entries elsewhere has bounds of its
        own and ignores these."""
        ...

    async def upkeep(self) -> None:
        """The router's maintenance pass, every few seconds: what the store must do besides answering requests."""
        ...

    def health(self) -> dict[str, Any]: ...

    async def close(self) -> None: ...


class MemoryStore:
    """Insertion-ordered and bounded by entries and by bytes. All entries share one TTL, so the oldest entry is
    always the first to expire and sweeping is O(1) per removed entry; the bounds also evict oldest first, when an
    entry is added.

    Entries are kept as rows (tuples of strings, numbers and bytes): the garbage collector stops tracking those, so
    a full collection does not walk every entry (a million Entry objects took it ~0.5 s)."""

    kind = "memory"
    immediate = True

    def __init__(
        self,
        max_entries: int,
        max_bytes: int = StoreConfig.model_fields["max_bytes"].default,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._clock = clock
        self._entries: OrderedDict[str, Row] = OrderedDict()
        # Keys by decode endpoint, as dicts rather than sets: a dict of strings to None is never GC-tracked.
        self._by_endpoint: dict[str, dict[str, None]] = {}
        self._bytes = 0

    def _forget(self, key: str, row: Row) -> None:
        self._bytes -= _row_bytes(row)
        keys = self._by_endpoint.get(row[_URL])
        if keys is not None:
            keys.pop(key, None)
            if not keys:
                del self._by_endpoint[row[_URL]]

    def _sweep(self, now: float, evict: bool = False) -> int:
        """Remove entries past their grace and, with `evict`, the oldest ones beyond the bounds; returns how many
        were evicted."""
        entries = self._entries
        evicted = 0
        while entries:
            key, row = next(iter(entries.items()))
            if row[_EXPIRES_AT] + EXPIRED_GRACE_SECONDS > now:
                if not (evict and (len(entries) > self.max_entries or self._bytes > self.max_bytes)):
                    break
                evicted += 1
            entries.popitem(last=False)
            self._forget(key, row)
        return evicted

    async def put(self, key: str, entry: Entry, ttl: float) -> int:
        now = self._clock()
        entry.expires_at = now + ttl
        old = self._entries.pop(key, None)
        if old is not None:
            self._forget(key, old)
        row = entry.to_row()
        self._entries[key] = row
        self._bytes += _row_bytes(row)
        self._by_endpoint.setdefault(entry.decode_url, {})[key] = None
        return self._sweep(now, evict=True)

    async def take(self, key: str) -> Entry | None:
        now = self._clock()
        row = self._entries.pop(key, None)
        entry = None
        if row is not None:
            self._forget(key, row)
            entry = Entry.from_row(row)
            entry.remaining = entry.expires_at - now
        self._sweep(now)
        return entry

    async def drop_endpoint(self, url: str) -> int:
        keys = self._by_endpoint.get(url, ())
        dropped = 0
        for key in keys:
            row = self._entries.get(key)
            if row is not None and row[_BLOB] is not None:
                tomb = Entry(
                    decode_url=url, reason=ENDPOINT_GONE, expires_at=row[_EXPIRES_AT], prefill_url=row[_PREFILL]
                ).to_row()
                self._entries[key] = tomb  # keeps its place in the expiry order
                self._bytes += _row_bytes(tomb) - _row_bytes(row)
                dropped += 1
        return dropped

    async def held(self, url: str, remaining: float = 0.0) -> int:
        after = self._clock() + remaining
        entries = self._entries
        count = 0
        for key in self._by_endpoint.get(url, ()):
            row = entries.get(key)
            if row is not None and row[_BLOB] is not None and row[_EXPIRES_AT] > after:
                count += 1
        return count

    async def sweep(self) -> int:
        """Remove what has expired, and the oldest entries beyond the bounds (lowered by a reload); returns how many
        were evicted."""
        return self._sweep(self._clock(), evict=True)

    async def upkeep(self) -> None:
        await self.sweep()

    def set_bounds(self, max_entries: int, max_bytes: int) -> None:
        # Lower bounds evict the oldest entries at the next put or sweep.
        self.max_entries, self.max_bytes = max_entries, max_bytes

    def bytes_bound(self) -> int:
        return self.max_bytes

    async def size(self) -> int:
        return len(self._entries)

    def bytes_held(self) -> int:
        return self._bytes

    def health(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "healthy": True,
            "entries": len(self._entries),
            "max_entries": self.max_entries,
            "bytes": self._bytes,
            "max_bytes": self.max_bytes,
        }

    async def close(self) -> None:
        self._entries.clear()
        self._by_endpoint.clear()
        self._bytes = 0


def store_mac_key(secret: str | None) -> bytes | None:
    """The key that seals Redis entries, derived from a secret only the routers hold (the engine key); None: none."""
    return hmac.new(secret.encode(), b"duplex redis entries", hashlib.sha256).digest() if secret else None


class RedisStore:
    """Shared by every router replica: GETDEL makes the take atomic across them, PX gives the TTL. With `mac_key`,
    each value is sealed with an HMAC over its Redis key and bytes: whoever can write Redis but lacks the routers'
    secret cannot forge an entry, move one under another tenant's key, or aim prefill's read elsewhere (a value that
    fails the check is a store error, and the turn recomputes)."""

    kind = "redis"
    immediate = False

    def __init__(
        self,
        url: str,
        key_prefix: str,
        op_timeout: float,
        error_backoff: float,
        client: Any = None,
        mac_key: bytes | None = None,
    ):
        import redis.asyncio as aioredis
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        self._prefix = key_prefix
        self._mac_key = mac_key
        self._op_timeout = op_timeout
        self._backoff = error_backoff
        # No client-side retries: a slow or down Redis must cost one bounded wait, then the request recomputes.
        self._redis = client or aioredis.from_url(
            url,
            socket_timeout=op_timeout,
            socket_connect_timeout=op_timeout,
            retry=Retry(NoBackoff(), 0),
            health_check_interval=30,
        )
        self._down_until = 0.0
        self.errors = 0
        self.last_error: str | None = None
        self._healthy = True
        self._size: int | None = None
        self._size_at = 0.0

    def _key(self, key: str) -> str:
        return self._prefix + key

    def _tag(self, name: str, value: bytes) -> bytes:
        assert self._mac_key is not None
        return hmac.new(self._mac_key, name.encode() + b"\0" + value, hashlib.sha256).digest()[:MAC_BYTES]

    def _seal(self, name: str, value: bytes) -> bytes:
        return value if self._mac_key is None else self._tag(name, value) + value

    def _open(self, name: str, raw: bytes) -> bytes:
        if self._mac_key is None:
            return raw
        tag, value = raw[:MAC_BYTES], raw[MAC_BYTES:]
        if not hmac.compare_digest(tag, self._tag(name, value)):
            log.warning("redis store: the entry under %s failed its integrity check; recomputing", name)
            raise StoreError("an entry failed its integrity check")
        return value

    def _endpoint_key(self, url: str) -> str:
        # "epz:", a sorted set; routers before it kept a plain set under "ep:", which expires on its own.
        return self._prefix + "epz:" + hashlib.sha256(url.encode()).hexdigest()[:32]

    async def _run(self, op: str, fn: Callable[[], Any]) -> Any:
        now = time.monotonic()
        if now < self._down_until:
            raise StoreError(f"redis unavailable (backing off after: {self.last_error})")
        try:
            async with asyncio.timeout(self._op_timeout):
                result = await fn()
        except Exception as exc:  # redis errors, OSError, TimeoutError: all mean "no answer"
            self.errors += 1
            self.last_error = f"{op}: {type(exc).__name__}: {exc}"
            self._healthy = False
            self._down_until = time.monotonic() + self._backoff
            log.warning("redis store %s failed: %s", op, self.last_error)
            raise StoreError(self.last_error) from exc
        self._healthy = True
        return result

    async def put(self, key: str, entry: Entry, ttl: float) -> int:
        entry.expires_at = time.time() + ttl
        keep_ms = int((ttl + EXPIRED_GRACE_SECONDS) * 1000)
        value = self._seal(self._key(key), entry.to_bytes())
        endpoint_key = self._endpoint_key(entry.decode_url)

        now_ms = int(time.time() * 1000)

        async def op() -> None:
            # The endpoint's index scores each key by when it can no longer exist; each put prunes what has passed
            # (taken or expired), so the index holds at most the entries written within one TTL, in one round trip.
            pipe = self._redis.pipeline(transaction=False)
            pipe.set(self._key(key), value, px=keep_ms)
            pipe.zadd(endpoint_key, {key: now_ms + keep_ms})
            pipe.zremrangebyscore(endpoint_key, "-inf", now_ms)
            pipe.pexpire(endpoint_key, keep_ms)
            await pipe.execute()

        await self._run("put", op)
        return 0  # Redis's own maxmemory policy bounds it

    async def take(self, key: str) -> Entry | None:
        raw = await self._run("take", lambda: self._redis.getdel(self._key(key)))
        if raw is None:
            return None
        entry = Entry.from_bytes(self._open(self._key(key), raw))
        entry.remaining = entry.expires_at - time.time()
        return entry

    async def drop_endpoint(self, url: str) -> int:
        """Turn the endpoint's entries into tombstones, DROP_BATCH keys per round trip (never the whole index in one
        reply), then delete its index."""
        endpoint_key = self._endpoint_key(url)
        tomb = Entry(decode_url=url, reason=ENDPOINT_GONE, expires_at=time.time()).to_bytes()
        dropped = 0

        async def batch(start: int) -> tuple[int, bool]:
            reply = await self._redis.zrangebyscore(
                endpoint_key, int(time.time() * 1000), "+inf", start=start, num=DROP_BATCH
            )
            members = cast(list[bytes], reply)  # the client does not decode responses
            pipe = self._redis.pipeline(transaction=False)
            for member in members:
                name = member.decode()
                # XX + KEEPTTL: only entries still present turn into tombstones, and they keep their expiry.
                pipe.set(self._key(name), self._seal(self._key(name), tomb), xx=True, keepttl=True)
            results = await pipe.execute() if members else []
            return sum(1 for r in results if r), len(members) == DROP_BATCH

        start, more = 0, True
        while more:
            count, more = await self._run("drop_endpoint", functools.partial(batch, start))
            dropped, start = dropped + count, start + DROP_BATCH
        await self._run("drop_endpoint", lambda: self._redis.delete(endpoint_key))
        return dropped

    async def held(self, url: str, remaining: float = 0.0) -> int:
        """Reads the endpoint's entries, DROP_BATCH per round trip: a taken entry is gone from Redis but stays in the
        index until its time has passed, and a tombstone holds nothing."""
        endpoint_key = self._endpoint_key(url)

        async def batch(start: int) -> tuple[int, bool]:
            now = time.time()
            reply = await self._redis.zrangebyscore(endpoint_key, int(now * 1000), "+inf", start=start, num=DROP_BATCH)
            names = [m.decode() for m in cast(list[bytes], reply)]
            values = cast(list[bytes | None], await self._redis.mget([self._key(n) for n in names])) if names else []
            live = 0
            for name, raw in zip(names, values, strict=True):
                if raw is None:
                    continue
                try:
                    entry = Entry.from_bytes(self._open(self._key(name), raw))
                except StoreError:
                    continue
                live += entry.replayable and entry.decode_url == url and entry.expires_at > now + remaining
            return live, len(names) == DROP_BATCH

        count, start, more = 0, 0, True
        while more:
            live, more = await self._run("held", functools.partial(batch, start))
            count, start = count + live, start + DROP_BATCH
        return count

    async def size(self) -> int | None:
        # Counting means a SCAN over the prefix; do it at most every 30 s.
        now = time.monotonic()
        if self._size is not None and now - self._size_at < 30:
            return self._size

        async def op() -> int:
            count = 0
            async for name in self._redis.scan_iter(match=self._prefix + "*", count=1000):
                # entry keys are hex digests: a name going on with "ep" is an endpoint index
                if not (name.decode() if isinstance(name, bytes) else name).startswith(self._prefix + "ep"):
                    count += 1
            return count

        try:
            async with asyncio.timeout(5):
                self._size = await op()
        except Exception as exc:
            log.debug("redis size scan failed: %s", exc)
            return self._size
        self._size_at = now
        return self._size

    async def ping(self) -> bool:
        try:
            await self._run("ping", self._redis.ping)
        except StoreError:
            return False
        return True

    async def upkeep(self) -> None:
        await self.ping()  # notices a Redis that is back before a request has to

    def set_bounds(self, max_entries: int, max_bytes: int) -> None:
        pass  # Redis's own maxmemory policy bounds it

    def bytes_held(self) -> None:
        return None

    def bytes_bound(self) -> None:
        return None

    def health(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "healthy": self._healthy,
            "errors": self.errors,
            "last_error": self.last_error,
            "entries": self._size,
        }

    async def close(self) -> None:
        await self._redis.aclose()


def redis_url(cfg: StoreConfig) -> str:
    if cfg.redis_url_env:
        value = os.environ.get(cfg.redis_url_env)
        if value:
            return value
        if not cfg.redis_url:
            raise ValueError(f"environment variable {cfg.redis_url_env} (store.redis_url_env) is not set")
    assert cfg.redis_url
    return cfg.redis_url


def make_store(cfg: StoreConfig, secret: str | None = None) -> Store:
    """The store `cfg` names; Redis entries are sealed with a key derived from `secret` (the engine key)."""
    if cfg.kind == "redis":
        mac_key = store_mac_key(secret)
        if mac_key is None:
            log.warning("redis store: no router secret (engine key), so entries are not sealed against tampering")
        return RedisStore(
            redis_url(cfg), cfg.key_prefix, cfg.op_timeout_seconds, cfg.error_backoff_seconds, mac_key=mac_key
        )
    return MemoryStore(cfg.max_entries, cfg.max_bytes)

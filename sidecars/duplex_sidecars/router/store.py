"""Where decode's retained-block metadata waits for a conversation's next turn: in memory or in Redis.

Entries are single-use (an atomic take), live for the router TTL, and become tombstones when the decode endpoint
holding their blocks leaves. An entry stays readable for a short grace after it expires so that a late turn is
counted as `expired` rather than `no_entry`; it is never replayed then.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass
from typing import Any, Callable, Protocol

from duplex_sidecars.router.config import StoreConfig
from duplex_sidecars.router.history import Covered

log = logging.getLogger(__name__)

# How long past its TTL an entry is kept around (as a known-expired marker) before it is deleted.
EXPIRED_GRACE_SECONDS = 60.0

ENDPOINT_GONE = "endpoint_gone"
NOT_REPLAYABLE = "not_replayable"


class StoreError(Exception):
    """The store could not answer; the request recomputes."""


@dataclass
class Entry:
    """One conversation's stored decode reply, or a tombstone (params None) saying why there is nothing to replay."""

    decode_url: str
    params: dict[str, Any] | None = None
    reason: str | None = None  # tombstone reason
    covered: Covered | None = None
    scope: str | None = None
    expires_at: float = 0.0
    expired: bool = False  # set by take()

    def to_json(self) -> str:
        out = asdict(self)
        out.pop("expired")
        return json.dumps(out, separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: str | bytes) -> Entry:
        data = json.loads(raw)
        covered = data.get("covered")
        return cls(
            decode_url=data["decode_url"],
            params=data.get("params"),
            reason=data.get("reason"),
            covered=Covered(**covered) if covered else None,
            scope=data.get("scope"),
            expires_at=float(data.get("expires_at", 0.0)),
        )

    def tombstone(self, reason: str) -> Entry:
        return Entry(decode_url=self.decode_url, reason=reason, expires_at=self.expires_at)


class Store(Protocol):
    kind: str

    async def put(self, key: str, entry: Entry, ttl: float) -> None: ...

    async def take(self, key: str) -> Entry | None: ...

    async def drop_endpoint(self, url: str) -> int: ...

    async def size(self) -> int | None: ...

    def health(self) -> dict[str, Any]: ...

    async def close(self) -> None: ...


class MemoryStore:
    """Insertion-ordered and bounded. All entries share one TTL, so the oldest entry is always the first to expire
    and sweeping is O(1) per removed entry."""

    kind = "memory"

    def __init__(self, max_entries: int, clock: Callable[[], float] = time.monotonic):
        self.max_entries = max_entries
        self._clock = clock
        self._entries: OrderedDict[str, Entry] = OrderedDict()
        self._by_endpoint: dict[str, set[str]] = {}

    def _index_remove(self, key: str, entry: Entry) -> None:
        keys = self._by_endpoint.get(entry.decode_url)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._by_endpoint[entry.decode_url]

    def _sweep(self, now: float) -> None:
        entries = self._entries
        while entries:
            key, entry = next(iter(entries.items()))
            if entry.expires_at + EXPIRED_GRACE_SECONDS > now and len(entries) <= self.max_entries:
                break
            entries.popitem(last=False)
            self._index_remove(key, entry)

    async def put(self, key: str, entry: Entry, ttl: float) -> None:
        now = self._clock()
        entry.expires_at = now + ttl
        old = self._entries.pop(key, None)
        if old is not None:
            self._index_remove(key, old)
        self._entries[key] = entry
        self._by_endpoint.setdefault(entry.decode_url, set()).add(key)
        self._sweep(now)

    async def take(self, key: str) -> Entry | None:
        now = self._clock()
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._index_remove(key, entry)
            entry.expired = now >= entry.expires_at
        self._sweep(now)
        return entry

    async def drop_endpoint(self, url: str) -> int:
        keys = self._by_endpoint.get(url, ())
        dropped = 0
        for key in keys:
            entry = self._entries.get(key)
            if entry is not None and entry.params is not None:
                self._entries[key] = entry.tombstone(ENDPOINT_GONE)  # keeps its place in the expiry order
                dropped += 1
        return dropped

    async def sweep(self) -> None:
        self._sweep(self._clock())

    async def size(self) -> int:
        return len(self._entries)

    def health(self) -> dict[str, Any]:
        return {"kind": self.kind, "healthy": True, "entries": len(self._entries), "max_entries": self.max_entries}

    async def close(self) -> None:
        self._entries.clear()
        self._by_endpoint.clear()


class RedisStore:
    """Shared by every router replica: GETDEL makes the take atomic across them, PX gives the TTL."""

    kind = "redis"

    def __init__(self, url: str, key_prefix: str, op_timeout: float, error_backoff: float, client: Any = None):
        import redis.asyncio as aioredis
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        self._prefix = key_prefix
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

    def _endpoint_key(self, url: str) -> str:
        return self._prefix + "ep:" + hashlib.sha256(url.encode()).hexdigest()[:32]

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

    async def put(self, key: str, entry: Entry, ttl: float) -> None:
        entry.expires_at = time.time() + ttl
        keep_ms = int((ttl + EXPIRED_GRACE_SECONDS) * 1000)
        value = entry.to_json()
        endpoint_key = self._endpoint_key(entry.decode_url)

        async def op() -> None:
            pipe = self._redis.pipeline(transaction=False)
            pipe.set(self._key(key), value, px=keep_ms)
            pipe.sadd(endpoint_key, key)
            pipe.pexpire(endpoint_key, keep_ms)
            await pipe.execute()

        await self._run("put", op)

    async def take(self, key: str) -> Entry | None:
        raw = await self._run("take", lambda: self._redis.getdel(self._key(key)))
        if raw is None:
            return None
        try:
            entry = Entry.from_json(raw)
        except (ValueError, KeyError, TypeError) as exc:
            raise StoreError(f"undecodable entry: {exc}") from exc
        entry.expired = time.time() >= entry.expires_at
        return entry

    async def drop_endpoint(self, url: str) -> int:
        endpoint_key = self._endpoint_key(url)
        members = await self._run("drop_endpoint", lambda: self._redis.smembers(endpoint_key))
        if not members:
            return 0
        tomb = Entry(decode_url=url, reason=ENDPOINT_GONE, expires_at=time.time()).to_json()

        async def op() -> list[Any]:
            pipe = self._redis.pipeline(transaction=False)
            for member in members:
                name = member.decode() if isinstance(member, bytes) else member
                # XX + KEEPTTL: only entries still present turn into tombstones, and they keep their expiry.
                pipe.set(self._key(name), tomb, xx=True, keepttl=True)
            pipe.delete(endpoint_key)
            return await pipe.execute()

        results = await self._run("drop_endpoint", op)
        return sum(1 for r in results[:-1] if r)

    async def size(self) -> int | None:
        # Counting means a SCAN over the prefix; do it at most every 30 s.
        now = time.monotonic()
        if self._size is not None and now - self._size_at < 30:
            return self._size

        async def op() -> int:
            count = 0
            async for name in self._redis.scan_iter(match=self._prefix + "*", count=1000):
                if not (name.decode() if isinstance(name, bytes) else name).startswith(self._prefix + "ep:"):
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


def make_store(cfg: StoreConfig) -> Store:
    if cfg.kind == "redis":
        return RedisStore(redis_url(cfg), cfg.key_prefix, cfg.op_timeout_seconds, cfg.error_backoff_seconds)
    return MemoryStore(cfg.max_entries)

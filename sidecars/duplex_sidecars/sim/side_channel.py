"""The side channel (vLLM's VLLM_NIXL_SIDE_CHANNEL_PORT): handshake metadata, claim and release of retained blocks.

Handshake (GET /handshake): the engine's NIXL agent metadata, its buffer layout and its perf_counter clock, from which
the reader derives the clock offset that turns `remote_blocks_expiry_time` into its own clock (vLLM #47021). Readers
fetch it once per remote engine and cache it. POST /claim reserves retained blocks for one NIXL READ. The READ carries
a NIXL notification (`read_done_note`), which NIXL delivers to the owner once the READ is complete and after which the
owner frees the blocks, as vLLM's owner does; a reader whose READ failed sends POST /release instead.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp
from aiohttp import web

HANDSHAKE_VERSION = 5  # NIXL_CONNECTOR_VERSION once the handshake carried the clock


class BlockOwner(Protocol):
    """What the side channel needs from the engine that owns the blocks."""

    def handshake(self) -> dict[str, Any]: ...
    async def claim(self, request_id: str, block_ids: Sequence[int], reader: str) -> None: ...  # ClaimRefused
    def release(self, request_id: str) -> None: ...


def side_channel_app(owner: BlockOwner) -> web.Application:
    from duplex_sidecars.sim.retained import ClaimRefused

    async def handshake(_: web.Request) -> web.Response:
        return web.json_response(owner.handshake())

    async def claim(request: web.Request) -> web.Response:
        body = await request.json()
        try:
            block_ids = [int(b) for b in body["block_ids"]]
            await owner.claim(str(body["request_id"]), block_ids, str(body.get("reader", "")))
        except ClaimRefused as e:
            return web.json_response({"ok": False, "reason": e.reason}, status=409)
        return web.json_response({"ok": True, "agent_name": owner.handshake()["agent_name"]})

    async def release(request: web.Request) -> web.Response:
        body = await request.json()
        owner.release(str(body["request_id"]))
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_get("/handshake", handshake)
    app.router.add_post("/claim", claim)
    app.router.add_post("/release", release)
    return app


def read_done_note(request_id: str) -> bytes:
    """The NIXL notification a reader's READ carries: the owner's request id, as in vLLM's NixlConnector."""
    return request_id.encode()


def request_of_note(note: bytes) -> str:
    return note.decode(errors="replace")


def encode_metadata(md: bytes) -> str:
    return base64.b64encode(md).decode()


def decode_metadata(md: str) -> bytes:
    return base64.b64decode(md)


@dataclass(frozen=True)
class RemoteEngine:
    host: str
    port: int
    engine_id: str
    agent_name: str
    agent_metadata: bytes
    base_addr: int
    block_size: int
    block_bytes: int
    num_blocks: int
    clock_offset: float  # remote perf_counter - local perf_counter


class SideChannelError(RuntimeError):
    """The remote engine could not be reached or does not hold what the params say (a failed KV load)."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason, self.detail = reason, detail


class SideChannelClient:
    def __init__(self, timeout_s: float = 10.0):
        self._session: aiohttp.ClientSession | None = None
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._remotes: dict[tuple[str, int], RemoteEngine] = {}

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def _post(self, host: str, port: int, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        try:
            async with self._http().post(f"http://{host}:{port}{path}", json=body) as resp:
                return resp.status, await resp.json()
        except (aiohttp.ClientError, TimeoutError, ValueError) as e:
            raise SideChannelError("unreachable", f"{host}:{port}{path}: {e!r}") from e

    async def remote(self, host: str, port: int, engine_id: str, refresh: bool = False) -> RemoteEngine:
        """The remote engine behind a side channel, handshaking only on first use (or when told to refresh)."""
        key = (host, port)
        cached = self._remotes.get(key)
        if cached is not None and not refresh and cached.engine_id == engine_id:
            return cached
        url = f"http://{host}:{port}/handshake"
        try:
            t0 = time.perf_counter()
            async with self._http().get(url) as resp:
                resp.raise_for_status()
                hs = await resp.json()
            t1 = time.perf_counter()
        except (aiohttp.ClientError, TimeoutError, ValueError) as e:
            raise SideChannelError("unreachable", f"{url}: {e!r}") from e
        if hs.get("engine_id") != engine_id:
            raise SideChannelError("engine_mismatch", f"{url} is engine {hs.get('engine_id')!r}, not {engine_id!r}")
        remote = RemoteEngine(
            host=host,
            port=port,
            engine_id=hs["engine_id"],
            agent_name=hs["agent_name"],
            agent_metadata=decode_metadata(hs["agent_metadata"]),
            base_addr=int(hs["base_addr"]),
            block_size=int(hs["block_size"]),
            block_bytes=int(hs["block_bytes"]),
            num_blocks=int(hs["num_blocks"]),
            # The remote clock was read somewhere in [t0, t1]; the midpoint halves the error.
            clock_offset=float(hs["clock"]) - (t0 + t1) / 2,
        )
        self._remotes[key] = remote
        return remote

    async def claim(self, remote: RemoteEngine, request_id: str, block_ids: Sequence[int], reader: str) -> str:
        """Reserve retained blocks for one READ by agent `reader`; returns the owner's current NIXL agent name."""
        payload = {"request_id": request_id, "block_ids": list(block_ids), "reader": reader}
        status, body = await self._post(remote.host, remote.port, "/claim", payload)
        if status != 200 or not body.get("ok"):
            raise SideChannelError(str(body.get("reason", f"http_{status}")), f"request {request_id}")
        return str(body["agent_name"])

    async def release(self, remote: RemoteEngine, request_id: str) -> None:
        await self._post(remote.host, remote.port, "/release", {"request_id": request_id})

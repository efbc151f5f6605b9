"""The engine's NIXL agent: registers the block buffer, READs remote blocks into local ones, collects "done" notes.

NIXL agents are not thread-safe without a sync mode, so every agent call runs on one dedicated thread; the event
loop only awaits. Like vLLM's NixlConnector, both sides of a READ are prepared once as block lists (the local pool at
start, a remote pool when its agent is added) and each READ names block indices in them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from duplex_sidecars.sim.kv_blocks import BlockPool

log = logging.getLogger("duplex.sim.nixl")

INSTALL_HINT = (
    "the simulator needs NIXL's Python API: pip install --no-deps nixl-cu12==1.5.1 "
    "(the `nixl` meta-package would pull torch, which the DRAM path never uses)"
)

# The UCX backend's progress thread sleeps in poll() on its workers' event fds and wakes on this timeout only as a
# guard against missed wake-ups (a UCX bug NIXL works around). NIXL's Python API hard-codes it to 0, which makes the
# thread spin: about half a core per idle engine. 10 ms costs under 1% of a core; transfers are driven by events.
PROGRESS_THREAD_WAKEUP_US = 10_000

# A READ on one host (UCX's cma transport) is usually complete when transfer() returns; a small one over tcp takes
# tens of microseconds, a large one milliseconds. The agent thread re-checks for SPIN_S, which catches the small ones
# without a thread hop per check; longer waits go to the event loop, whose timers have millisecond resolution.
SPIN_S = 0.0002
POLL_S = 0.001


class NixlUnavailable(RuntimeError):
    pass


class TransferFailed(RuntimeError):
    pass


def load_nixl_api() -> Any:
    """NIXL's `_api` module, from the CUDA-variant wheel when present (the `nixl` meta-package imports torch)."""
    import importlib

    for package in ("nixl_cu12", "nixl_cu13", "nixl"):
        try:
            return importlib.import_module(f"{package}._api")
        except ImportError:
            continue
    raise NixlUnavailable(INSTALL_HINT)


def _block_list(base_addr: int, block_bytes: int, num_blocks: int) -> np.ndarray:
    """A whole buffer as one strided row of NIXL descriptors: (address, length, device, stride, count)."""
    return np.array([[base_addr, block_bytes, 0, block_bytes, num_blocks]], dtype=np.int64)


class NixlTransport:
    def __init__(self, agent_name: str, pool: BlockPool, backend: str = "UCX"):
        api = load_nixl_api()
        self.pool = pool
        self.agent_name = agent_name
        self.backend = backend
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nixl")
        with _progress_thread_wakeup(api, PROGRESS_THREAD_WAKEUP_US):
            self._agent = api.nixl_agent(agent_name, api.nixl_agent_config(backends=[backend]))
        if backend not in self._agent.backends:
            raise NixlUnavailable(f"NIXL backend {backend!r} is not available (plugins: {self._agent.plugin_list})")
        # One registration for the whole buffer; transfers address blocks inside it.
        self._reg = self._agent.register_memory(
            [(pool.block_address(0), pool.num_blocks * pool.block_bytes, 0, "")], "DRAM"
        )
        self._local = self._agent.prep_xfer_dlist(
            "NIXL_INIT_AGENT", _block_list(pool.block_address(0), pool.block_bytes, pool.num_blocks), "DRAM"
        )
        self._remotes: dict[str, Any] = {}  # remote agent name -> its prepared block list

    def metadata(self) -> bytes:
        return self._agent.get_agent_metadata()

    async def _call(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)

    async def add_remote(self, agent_name: str, metadata: bytes, base_addr: int, num_blocks: int) -> None:
        """Load a remote agent (once) and prepare its block buffer, which must have our block size."""

        def load() -> None:
            if agent_name in self._remotes:  # two pulls from a new engine raced here
                return
            loaded = self._agent.add_remote_agent(metadata)
            if isinstance(loaded, bytes):  # nixl-cu12 1.5 returns the name as bytes
                loaded = loaded.decode()
            if loaded != agent_name:
                raise TransferFailed(f"metadata of agent {loaded!r} handed over as {agent_name!r}")
            blocks = _block_list(base_addr, self.pool.block_bytes, num_blocks)
            self._remotes[agent_name] = self._agent.prep_xfer_dlist(agent_name, blocks, "DRAM")

        await self._call(load)

    def knows(self, agent_name: str) -> bool:
        return agent_name in self._remotes

    async def read(
        self,
        remote_agent: str,
        local_block_ids: Sequence[int],
        remote_block_ids: Sequence[int],
        notification: bytes = b"",
    ) -> int:
        """READ remote blocks into local blocks; returns the bytes moved. NIXL delivers `notification` (if any) to
        the remote agent once the READ is complete."""
        local = np.asarray(local_block_ids, dtype=np.int32)
        remote = np.asarray(remote_block_ids, dtype=np.int32)

        def post() -> tuple[Any, str]:
            handle = self._agent.make_prepped_xfer(
                "READ", self._local, local, self._remotes[remote_agent], remote, notification
            )
            try:
                state = self._agent.transfer(handle)
                deadline = time.perf_counter() + SPIN_S
                while state == "PROC" and time.perf_counter() < deadline:
                    time.sleep(0)  # lets the event loop's thread take the GIL between checks
                    state = self._agent.check_xfer_state(handle)
            except BaseException:
                self._release(handle)
                raise
            return handle, self._settle(handle, state)

        def check(handle: Any) -> str:
            return self._settle(handle, self._agent.check_xfer_state(handle))

        handle, state = await self._call(post)
        try:
            while state == "PROC":
                await asyncio.sleep(POLL_S)
                state = await self._call(check, handle)
        except BaseException:  # cancelled mid-transfer: give the handle back (NIXL aborts the transfer)
            await asyncio.shield(self._call(self._release, handle))
            raise
        if state != "DONE":
            raise TransferFailed(f"NIXL READ from {remote_agent} ended in state {state}")
        return self.pool.block_bytes * len(local)

    def _settle(self, handle: Any, state: str) -> str:
        """Release a finished transfer's handle in the same thread hop that saw it finish."""
        if state != "PROC":
            self._release(handle)
        return state

    def _release(self, handle: Any) -> None:
        try:
            handle.release()
        except Exception:  # an errored transfer may refuse release; the agent keeps it on its leak list
            log.warning("could not release NIXL transfer handle %r", handle)

    async def notifications(self) -> dict[str, list[bytes]]:
        """Notifications that arrived since the last call, by sending agent."""
        return await self._call(self._agent.get_new_notifs)

    def close(self) -> None:
        def shutdown() -> None:
            for name, blocks in self._remotes.items():
                with contextlib.suppress(Exception):
                    blocks.release()
                    self._agent.remove_remote_agent(name)
            self._local.release()
            self._agent.deregister_memory(self._reg)

        self._thread.submit(shutdown).result(timeout=10)
        self._thread.shutdown(wait=True)


@contextlib.contextmanager
def _progress_thread_wakeup(api: Any, micros: int) -> Iterator[None]:
    """Give agents created inside a progress-thread wake-up timeout (`nixl_agent_config` offers no option for it)."""
    bindings = api.nixlBind
    make_agent = bindings.nixlAgent
    applied = False

    def agent_with_wakeup(name: str, config: Any) -> Any:
        nonlocal applied
        config.pthrDelay = micros
        applied = True
        return make_agent(name, config)

    bindings.nixlAgent = agent_with_wakeup
    try:
        yield
    finally:
        bindings.nixlAgent = make_agent
    if not applied:
        log.warning("could not set NIXL's progress-thread wake-up; its progress thread may spin a core when idle")

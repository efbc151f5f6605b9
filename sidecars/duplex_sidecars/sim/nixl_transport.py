"""The engine's NIXL agent: registers the block buffer and READs remote blocks into local ones.

NIXL agents are not thread-safe without a sync mode, so every agent call runs on one dedicated thread; the event
loop only awaits, and polls transfer state between short sleeps.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from duplex_sidecars.sim.kv_blocks import BlockPool

log = logging.getLogger("duplex.sim.nixl")

INSTALL_HINT = (
    "the simulator needs NIXL's Python API: pip install --no-deps nixl-cu12==1.5.1 "
    "(the `nixl` meta-package would pull torch, which the DRAM path never uses)"
)


# The UCX backend's progress thread sleeps in poll() on its workers' event fds and wakes on that timeout only as a
# guard against missed wake-ups (a UCX bug NIXL works around). NIXL's Python API hard-codes the timeout to 0, which
# makes the thread spin: about half a core per idle engine. 10 ms costs under 1% of a core and bounds a missed
# wake-up; transfers themselves are driven by events, not by the timeout.
PROGRESS_THREAD_WAKEUP_US = 10_000


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
        self._remotes: set[str] = set()

    def metadata(self) -> bytes:
        return self._agent.get_agent_metadata()

    async def _call(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)

    async def add_remote(self, metadata: bytes) -> str:
        """Load a remote agent's metadata (once per agent); returns its name."""
        name = await self._call(self._agent.add_remote_agent, metadata)
        self._remotes.add(name)
        return name

    def knows(self, agent_name: str) -> bool:
        return agent_name in self._remotes

    async def read(
        self,
        remote_agent: str,
        remote_base_addr: int,
        local_block_ids: Sequence[int],
        remote_block_ids: Sequence[int],
    ) -> int:
        """READ remote blocks into local blocks (same block size); returns the bytes moved."""
        bb = self.pool.block_bytes
        local = [(self.pool.block_address(b), bb, 0) for b in local_block_ids]
        remote = [(remote_base_addr + b * bb, bb, 0) for b in remote_block_ids]

        def post() -> tuple[Any, str]:
            handle = self._agent.initialize_xfer(
                "READ",
                self._agent.get_xfer_descs(local, "DRAM"),
                self._agent.get_xfer_descs(remote, "DRAM"),
                remote_agent,
            )
            return handle, self._agent.transfer(handle)

        handle, state = await self._call(post)
        try:
            delay = 0.0002
            while state == "PROC":
                await asyncio.sleep(delay)
                delay = min(delay * 2, 0.005)
                state = await self._call(self._agent.check_xfer_state, handle)
            if state != "DONE":
                raise TransferFailed(f"NIXL READ from {remote_agent} ended in state {state}")
        finally:
            await self._call(self._release, handle)
        return bb * len(local_block_ids)

    def _release(self, handle: Any) -> None:
        try:
            handle.release()
        except Exception:  # an errored transfer may refuse release; the agent keeps it on its leak list
            log.warning("could not release NIXL transfer handle %r", handle)

    def close(self) -> None:
        def shutdown() -> None:
            for name in self._remotes:
                try:
                    self._agent.remove_remote_agent(name)
                except Exception:
                    pass
            self._agent.deregister_memory(self._reg)

        self._thread.submit(shutdown).result(timeout=10)
        self._thread.shutdown(wait=True)


@contextlib.contextmanager
def _progress_thread_wakeup(api: Any, micros: int) -> Iterator[None]:
    """Give the agents created inside a progress-thread wake-up timeout (`nixl_agent` offers no option for it)."""
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

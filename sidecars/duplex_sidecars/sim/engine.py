"""One simulated vLLM engine: prefix cache, remote KV pulls over NIXL, deterministic decoding, block retention.

Like vLLM with NixlConnector, behaviour follows each request's `kv_transfer_params`, not the engine's role:
  * `do_remote_decode` (the P node): maybe read decode's retained blocks (bidirectional turn >= 2), prefill, sample one
    token, keep the prompt blocks for decode under a lease and return P's params;
  * other params (the D node): read the prompt blocks from P, decode, and with bidirectional mode keep the blocks for
    `decoder_kv_blocks_ttl` and return D's params;
  * no params: plain local serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncGenerator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from duplex_sidecars.sim import generation, kv_policy
from duplex_sidecars.sim.config import SimConfig
from duplex_sidecars.sim.kv_blocks import BlockPool, block_hashes, num_blocks_for, token_chain
from duplex_sidecars.sim.metrics import SimMetrics
from duplex_sidecars.sim.nixl_transport import NixlTransport, TransferFailed
from duplex_sidecars.sim.retained import RetainedBlocks
from duplex_sidecars.sim.side_channel import (
    HANDSHAKE_VERSION,
    SideChannelClient,
    SideChannelError,
    encode_metadata,
    read_done_note,
    request_of_note,
)

if TYPE_CHECKING:  # sim/tracing.py loads OpenTelemetry: only with --otlp-traces-endpoint
    from duplex_sidecars.sim.tracing import EngineTracer, KVRead, RequestSpan

log = logging.getLogger("duplex.sim.engine")

_REAP_INTERVAL_S = 0.25
# How often an owner looks for READ-complete notes while blocks are claimed: soon after a claim (a READ on one host is
# done in well under a millisecond), then less and less often for a claimant that went quiet (slow link, dead reader).
_NOTE_POLL_S = 0.001
_NOTE_POLL_MAX_S = 0.05


class KVLoadFailed(RuntimeError):
    """A remote KV load failed and kv_load_failure_policy is "fail" (vLLM fails the request)."""


class CorruptKV(RuntimeError):
    """Blocks read over NIXL did not hold their prefix's bytes and --fail-on-corrupt is set."""


@dataclass
class GenerationRequest:
    request_id: str  # the engine-internal id, returned to peers as remote_request_id
    prompt: list[int]
    max_tokens: int | None = None
    min_tokens: int = 0
    ignore_eos: bool = False
    kv_params: dict[str, Any] | None = None
    cache_salt: str | None = None  # keeps this prompt's blocks apart in the prefix cache (vLLM's cache_salt)
    trace_headers: dict[str, str] | None = None  # the request's traceparent and tracestate (vLLM's trace_headers)


@dataclass
class Running:
    """A request between its prefill and the end of decoding."""

    req: GenerationRequest
    arrived: float
    block_ids: list[int]
    chain: np.ndarray  # prefix hashes, room for prompt + reply; rows [0, num_kv_tokens) are filled
    num_kv_tokens: int
    reply: generation.Reply
    output: list[int] = field(default_factory=list)
    kv_params_out: dict[str, Any] | None = None
    finished: bool = False
    # vLLM's prefill stats: prompt tokens not computed here (local cache hits + remote KV), and prompt tokens this
    # request newly wrote to the prefix cache.
    num_cached_tokens: int = 0
    num_cache_creation_tokens: int = 0
    queued_seconds: float = 0.0  # waiting for the compute slot
    first_token_at: float | None = None  # perf_counter
    completed: bool = False  # finished normally (not aborted)
    trace: RequestSpan | None = None  # its llm_request span, with tracing on

    @property
    def finish_reason(self) -> str:
        return self.reply.finish_reason


class Engine:
    def __init__(self, cfg: SimConfig, transport: NixlTransport | None = None, tracer: EngineTracer | None = None):
        """`tracer`: the engine's spans (sim/tracing.py); default: one for cfg.otlp_traces_endpoint, when set."""
        self.cfg = cfg
        self.tracer = tracer if tracer is not None else tracer_of(cfg)
        self.pool = BlockPool(cfg.num_blocks, cfg.block_size, cfg.block_bytes, cfg.model)
        self.metrics = SimMetrics(cfg.model)
        self.retained = RetainedBlocks()
        self.side = SideChannelClient()
        self.transport = transport or NixlTransport(
            f"{cfg.engine_id}-{uuid.uuid4().hex[:8]}", self.pool, cfg.nixl_backend
        )
        self._metadata = encode_metadata(self.transport.metadata())
        self._tasks: list[asyncio.Task[None]] = []
        self._claimed = asyncio.Event()
        self._compute = asyncio.Lock()

    # -- lifecycle --------------------------------------------------------------------------------------------
    async def start(self) -> None:
        self._tasks = [asyncio.create_task(self._reap_forever()), asyncio.create_task(self._collect_read_notes())]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.side.close()
        self.transport.close()
        if self.tracer is not None:
            await asyncio.to_thread(self.tracer.shutdown)  # the spans still queued go out

    async def _reap_forever(self) -> None:
        while True:
            await asyncio.sleep(_REAP_INTERVAL_S)
            for request_id in self.retained.expired(time.perf_counter()):
                log.info("retained blocks of %s expired; freeing them", request_id)
                self.release(request_id)

    # -- side channel (BlockOwner) ----------------------------------------------------------------------------
    def handshake(self) -> dict[str, Any]:
        return {
            "version": HANDSHAKE_VERSION,
            "engine_id": self.cfg.engine_id,
            "agent_name": self.transport.agent_name,
            "agent_metadata": self._metadata,
            "clock": time.perf_counter(),
            "base_addr": self.pool.block_address(0),
            "block_size": self.pool.block_size,
            "block_bytes": self.pool.block_bytes,
            "num_blocks": self.pool.num_blocks,
            "model": self.cfg.model,
        }

    async def claim(self, request_id: str, block_ids: Sequence[int], reader: str) -> None:
        if self.retained.is_claimed(request_id):
            # A replay right after a READ: its note is most likely here already, so the answer is "gone".
            await self._apply_read_notes()
        self.retained.claim(request_id, block_ids, time.perf_counter(), reader)
        self._claimed.set()

    def release(self, request_id: str, reader: str | None = None) -> None:
        self.pool.free(self.retained.release(request_id, reader))
        self.metrics.retained_blocks.set(self.retained.num_blocks)

    async def _collect_read_notes(self) -> None:
        """Free claimed blocks once their reader's READ-complete note arrives; looks only while some are claimed."""
        delay = _NOTE_POLL_S
        while True:
            if not self.retained.num_claimed:
                self._claimed.clear()
                await self._claimed.wait()
            if self._claimed.is_set():
                self._claimed.clear()
                delay = _NOTE_POLL_S
            await asyncio.sleep(delay)
            delay = min(delay * 2, _NOTE_POLL_MAX_S)
            try:
                await self._apply_read_notes()
            except Exception:  # claimed blocks still go at their deadline
                log.exception("could not collect NIXL notifications")

    async def _apply_read_notes(self) -> None:
        for reader, notes in (await self.transport.notifications()).items():
            for note in notes:
                self.release(request_of_note(note), reader)

    # -- serving ----------------------------------------------------------------------------------------------
    async def prefill(self, req: GenerationRequest) -> Running:
        """Bring the prompt's KV into local blocks (cache hits, remote pull, compute). Raises before any output."""
        trace = self.tracer.request(req) if self.tracer is not None else None
        arrived = time.perf_counter()
        bs = self.cfg.block_size
        prompt_len = len(req.prompt)
        chain = token_chain(req.prompt, self.cfg.model)
        hits = self.pool.match_prefix(block_hashes(chain, bs, req.cache_salt)) if self.cfg.enable_prefix_caching else []
        # The last prompt token is always computed: its logits give the first output token.
        while hits and len(hits) * bs >= prompt_len:
            self.pool.free([hits.pop()])
        try:
            block_ids = hits + self.pool.allocate(num_blocks_for(prompt_len, bs) - len(hits))
        except Exception as exc:
            self.pool.free(hits)
            if trace is not None:
                trace.failed(exc)
            raise
        self.metrics.num_requests_running.inc()
        try:
            local_hits = len(hits) * bs
            external = await self._maybe_pull(req, chain, block_ids, local_hits, trace)
            computed = local_hits + external
            waiting = time.perf_counter()
            async with self._compute:  # one prefill computes at a time, first come first served, as in vLLM's steps
                queued = time.perf_counter() - waiting
                await _sleep(self.cfg.cost.prefill_seconds(prompt_len - computed, computed))
            self.pool.write(block_ids, chain, computed, prompt_len)
            if self.cfg.enable_prefix_caching:
                self.pool.cache(block_ids, block_hashes(chain, bs, req.cache_salt))
            self.metrics.prompt_tokens.inc(prompt_len)
            self.metrics.prompt_tokens_by_source(prompt_len - computed, local_hits, external)
        except BaseException as exc:
            self.pool.free(block_ids)
            self.metrics.num_requests_running.dec()
            if trace is not None:
                trace.failed(exc)
            raise
        reply = generation.reply(req.prompt, req.max_tokens, req.min_tokens, req.ignore_eos)
        room = np.zeros((prompt_len + len(reply.tokens), chain.shape[1]), dtype=chain.dtype)
        room[:prompt_len] = chain
        cacheable = prompt_len // bs * bs if self.cfg.enable_prefix_caching else 0
        return Running(
            req,
            arrived,
            block_ids,
            room,
            prompt_len,
            reply,
            num_cached_tokens=computed,
            num_cache_creation_tokens=max(0, cacheable - computed),
            queued_seconds=queued,
            trace=trace,
        )

    async def decode(self, run: Running) -> AsyncGenerator[int, None]:
        """Yield the reply's tokens; on normal completion retain blocks and set `run.kv_params_out`."""
        try:
            for i, tok in enumerate(run.reply.tokens):
                if i == 0:
                    run.first_token_at = time.perf_counter()
                    self.metrics.ttft.observe(run.first_token_at - run.arrived)
                else:
                    await _sleep(self.cfg.cost.decode_seconds())
                    # This step computes the KV of the previous output token (vLLM's num_computed_tokens).
                    self._append_kv(run, run.reply.tokens[i - 1])
                run.output.append(tok)
                yield tok
            self._finish(run)
        finally:
            self.abort(run)

    def abort(self, run: Running) -> None:
        """End a request that did not finish (client gone, error): vLLM frees at once and returns no params."""
        if not run.finished:
            run.finished = True
            self.pool.free(run.block_ids)
            self.metrics.num_requests_running.dec()
            if run.trace is not None:
                run.trace.finish(run)

    def _append_kv(self, run: Running, tok: int) -> None:
        pos = run.num_kv_tokens
        if pos // self.cfg.block_size >= len(run.block_ids):
            run.block_ids += self.pool.allocate(1)
        run.chain[pos] = token_chain([tok], self.cfg.model, prev=run.chain[pos - 1].tobytes())[0]
        self.pool.write(run.block_ids, run.chain, pos, pos + 1)
        run.num_kv_tokens = pos + 1

    def _finish(self, run: Running) -> None:
        run.finished = run.completed = True
        cfg, params = self.cfg, run.req.kv_params
        chain = run.chain[: run.num_kv_tokens]
        if cfg.enable_prefix_caching:
            self.pool.cache(run.block_ids, block_hashes(chain, cfg.block_size, run.req.cache_salt))
        self.metrics.generation_tokens.inc(len(run.output))
        self.metrics.request_success(run.finish_reason)
        self.metrics.num_requests_running.dec()
        now = time.perf_counter()
        if kv_policy.is_prefill_request(params):
            # P keeps the prompt blocks until decode has read them (or the lease runs out).
            self.retained.retain(run.req.request_id, run.block_ids, run.num_kv_tokens, now + cfg.kv_lease_duration)
            run.kv_params_out = self._params_out(run, is_p_node=True, expiry=None)
            # vLLM's scheduler adds P's cache hits, which decode reports as its own cached prompt tokens.
            run.kv_params_out["remote_prefill_cached_tokens"] = run.num_cached_tokens
        elif params is not None and cfg.bidirectional:
            deadline = now + cfg.decoder_kv_blocks_ttl
            self.retained.retain(run.req.request_id, run.block_ids, run.num_kv_tokens, deadline)
            run.kv_params_out = self._params_out(run, is_p_node=False, expiry=deadline)
        else:
            self.pool.free(run.block_ids)
        self.metrics.retained_blocks.set(self.retained.num_blocks)
        if run.trace is not None:
            run.trace.finish(run)

    def _params_out(self, run: Running, is_p_node: bool, expiry: float | None) -> dict[str, Any]:
        # The shape of vLLM's pull scheduler `request_finished` (vllm-pd-protocol.md §1.3).
        return {
            "do_remote_prefill": is_p_node,
            "do_remote_decode": not is_p_node,
            "remote_block_ids": [list(run.block_ids)],
            "remote_engine_id": self.cfg.engine_id,
            "remote_request_id": run.req.request_id,
            "remote_host": self.cfg.advertised_host,
            "remote_port": self.cfg.side_channel_port,
            "tp_size": 1,
            "dcp_size": 1,
            "pp_size": 1,
            "remote_num_tokens": run.num_kv_tokens,
            "remote_blocks_expiry_time": expiry,
            "transfer_mode": "pull",
        }

    # -- remote KV --------------------------------------------------------------------------------------------
    async def _maybe_pull(
        self,
        req: GenerationRequest,
        chain: np.ndarray,
        block_ids: list[int],
        local_hits: int,
        trace: RequestSpan | None = None,
    ) -> int:
        """Tokens whose KV was read from a remote engine into `block_ids` (and verified)."""
        params = req.kv_params
        if not kv_policy.has_remote_blocks(params):
            return 0
        assert params is not None
        p_node = kv_policy.is_prefill_request(params)
        if p_node and not self.cfg.bidirectional:
            self.metrics.recompute_skip("bidirectional_disabled")
            return 0
        count = kv_policy.remote_token_count(params.get("remote_num_tokens"), len(req.prompt), local_hits)
        if count <= 0:
            return 0
        if p_node and kv_policy.below_recompute_threshold(count, self.cfg.kv_recompute_threshold):
            log.info(
                "Skipping remote pull for %s: %d tokens < threshold %d",
                req.request_id,
                count,
                self.cfg.kv_recompute_threshold,
            )
            self.metrics.recompute_skip("below_threshold")
            return 0
        with _traced_read(trace, p_node, params, count) as traced:
            try:
                return await self._pull(req, params, chain, block_ids, local_hits, count, p_node, traced)
            except SideChannelError as e:
                return self._load_failed(req, e.reason, e.detail, traced)
            except TransferFailed as e:
                return self._load_failed(req, "transfer_error", str(e), traced)

    async def _pull(
        self,
        req: GenerationRequest,
        params: dict[str, Any],
        chain: np.ndarray,
        block_ids: list[int],
        local_hits: int,
        count: int,
        p_node: bool,
        traced: KVRead | None = None,
    ) -> int:
        plan = kv_policy.pull_plan(local_hits, count, self.cfg.block_size)
        try:
            remote_ids = kv_policy.flat_block_ids(params["remote_block_ids"])
        except ValueError as e:
            raise SideChannelError("bad_params", str(e)) from e
        if plan.positions.stop > len(remote_ids):
            raise SideChannelError(
                "bad_params", f"{count} tokens need {plan.positions.stop} blocks, got {len(remote_ids)}"
            )
        host, port = str(params["remote_host"]), int(params["remote_port"])
        remote_request = str(params["remote_request_id"])
        remote = await self.side.remote(host, port, str(params["remote_engine_id"]))
        if (remote.block_size, remote.block_bytes) != (self.pool.block_size, self.pool.block_bytes):
            raise SideChannelError(
                "layout_mismatch", f"remote blocks are {remote.block_size} tokens/{remote.block_bytes} B"
            )
        if p_node and kv_policy.is_expired(
            params.get("remote_blocks_expiry_time"), remote.clock_offset, time.perf_counter()
        ):
            log.warning("Declining expired remote read for %s from engine %s.", req.request_id, remote.engine_id)
            self.metrics.kv_expired_reqs.inc()
            return self._load_failed(req, "expired", "blocks expired or about to", traced)
        wanted = [remote_ids[p] for p in plan.positions]
        agent_name = await self.side.claim(remote, remote_request, wanted, self.transport.agent_name)
        read = False
        try:
            if agent_name != remote.agent_name:  # the engine behind this side channel restarted
                remote = await self.side.remote(host, port, remote.engine_id, refresh=True)
            if not self.transport.knows(remote.agent_name):
                await self.transport.add_remote(
                    remote.agent_name, remote.agent_metadata, remote.base_addr, remote.num_blocks
                )
            local = [block_ids[p] for p in plan.positions]
            started = time.perf_counter()
            # NIXL hands the note to the owner once the READ is complete, which releases our claim there.
            nbytes = await self.transport.read(remote.agent_name, local, wanted, read_done_note(remote_request))
            read = True
        finally:
            if not read:
                await self.side.release(remote, remote_request)
        await _sleep(self.cfg.cost.read_seconds(nbytes, read_back=p_node))
        # vLLM records a transfer on the side that initiates the READ: the time it took (with the simulated
        # transfer cost) and its bytes.
        self.metrics.xfer_time.observe(time.perf_counter() - started)
        self.metrics.xfer_bytes.observe(nbytes)
        self.metrics.nixl_reads.inc()
        self.metrics.nixl_bytes_read.inc(nbytes)
        if traced is not None:
            traced.done(len(wanted), nbytes)
        check = self.pool.verify(block_ids, chain, plan.start, plan.end)
        if not check.ok:
            self.metrics.corrupt_blocks.inc(len(check.bad_positions))
            log.error(
                "CORRUPT KV: %d of %d blocks read for %s from engine %s (request %s) do not hold this prompt's "
                "prefix (block positions %s): the replayed params do not match the prompt",
                len(check.bad_positions),
                len(wanted),
                req.request_id,
                remote.engine_id,
                remote_request,
                check.bad_positions[:8],
            )
            if self.cfg.fail_on_corrupt:
                self.metrics.failed_kv_loads.inc()
                raise CorruptKV(f"{len(check.bad_positions)} corrupt KV blocks read from {remote.engine_id}")
            return self._load_failed(req, "corrupt", "blocks failed verification", traced)
        return count

    def _load_failed(self, req: GenerationRequest, reason: str, detail: str, traced: KVRead | None = None) -> int:
        """vLLM's kv_load_failure_policy: "recompute" computes the tokens locally, "fail" fails the request."""
        if traced is not None:
            traced.failed(reason, detail)
        self.metrics.failed_kv_loads.inc()
        if self.cfg.kv_load_failure_policy == "fail":
            raise KVLoadFailed(f"KV load failed for {req.request_id} ({reason}): {detail}")
        log.warning("KV load failed for %s (%s: %s); recomputing locally", req.request_id, reason, detail)
        self.metrics.recompute_skip(reason)
        return 0


def tracer_of(cfg: SimConfig) -> EngineTracer | None:
    """The engine's tracer with --otlp-traces-endpoint; None, and OpenTelemetry never loaded, without."""
    if cfg.otlp_traces_endpoint is None:
        return None
    from duplex_sidecars.sim.tracing import EngineTracer

    return EngineTracer(cfg.otlp_traces_endpoint, cfg.otlp_traces_protocol, cfg.engine_id, cfg.role)


@contextlib.contextmanager
def _traced_read(
    trace: RequestSpan | None, p_node: bool, params: dict[str, Any], count: int
) -> Iterator[KVRead | None]:
    """The span of one remote read under the request's, with tracing on."""
    if trace is None:
        yield None
        return
    read = trace.kv_read(p_node, params, count)
    try:
        yield read
    except BaseException as exc:
        read.end(exc)
        raise
    read.end()


async def _sleep(seconds: float) -> None:
    if seconds > 0:
        await asyncio.sleep(seconds)

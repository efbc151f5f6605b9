"""The TTFT benchmark's rig: real vLLM CPU engines (duplex_dev.launch.vllm) behind the real `duplex router`, and one
measured turn with the counters that say where its KV came from.

Time to first token of a non-streamed turn. vLLM 0.32 returns `kv_transfer_params` only in non-streamed answers, so
every turn is non-streamed (a streamed one would leave nothing to reuse). Its TTFT is what a streaming client would
have seen: the client's wall time for the whole turn minus the time decode spent after its first token, from decode's
own histograms (vllm:e2e_request_latency_seconds - vllm:time_to_first_token_seconds, whose sums grow by exactly this
request's values, since turns run one at a time). It holds the router, the prefill leg (with any D->P read), decode's
read of prefill's KV and decode's first step. Where the router's part went comes from the turn's receipt
(router/receipt.py): the prefill leg's time, the router's own, and whether the turn read decode's blocks back, and how
many tokens' worth. Only decode's first-token time needs its histograms: a non-streamed answer's first byte is its
last.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from duplex_dev import processes
from duplex_dev.launch.engine_key import DEV_ENGINE_AUTH
from duplex_dev.launch.router import RouterProcess
from duplex_dev.launch.vllm import Change, VllmEngine, served_model
from duplex_sidecars.router import receipt

EXTERNAL = "vllm:prompt_tokens_by_source_total"


class TurnError(RuntimeError):
    pass


def post(url: str, body: dict[str, Any], timeout: float = 900, headers: dict[str, str] | None = None) -> dict[str, Any]:
    return exchange(url, body, timeout, headers)[0]


def exchange(
    url: str, body: dict[str, Any], timeout: float = 900, headers: dict[str, str] | None = None
) -> tuple[dict[str, Any], dict[str, str]]:
    """The answer and its headers."""
    sent = {"content-type": "application/json", **(headers or {})}
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers=sent)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            out: dict[str, Any] = json.loads(resp.read())
            return out, dict(resp.headers)
    except urllib.error.HTTPError as err:
        raise TurnError(f"{url}: HTTP {err.code}: {err.read()[:1000]!r}") from err


class PinnedEngine(VllmEngine):
    """An engine confined to some CPUs (taskset), so that what it spins on cannot take the other engines' core."""

    def __init__(self, role: str, cpus: str, **kw: Any):
        super().__init__(role, **kw)
        self.cpus = cpus
        self.changes.append(Change("CPU affinity", "<all>", cpus, "the benchmark's core plan (taskset)"))

    def command(self) -> tuple[list[str], dict[str, str]]:
        argv, env = super().command()
        return ["taskset", "-c", self.cpus, *argv], env


def engine(role: str, preset: str, kv_gib: int, cpus: str, **kw: Any) -> VllmEngine:
    """A rendered engine on `cpus` with a KV cache of `kv_gib` GiB: decode keeps every finished turn's blocks for
    the block TTL, so it needs more than the launcher's default while three contenders' conversations are alive."""
    e = PinnedEngine(role, cpus, preset=preset, startup_timeout=900, **kw)
    before = e.cmd.env.get("VLLM_CPU_KVCACHE_SPACE")
    e.cmd.env["VLLM_CPU_KVCACHE_SPACE"] = f"{kv_gib:g}"
    e.changes.append(Change("VLLM_CPU_KVCACHE_SPACE", before, f"{kv_gib:g}", "the benchmark's KV budget for this role"))
    return e


def router_config(policy: str, block_ttl: float) -> dict[str, Any]:
    """Keyed by conversation id only: a turn sent without one never replays (the recompute and oracle contenders),
    one sent with it replays decode's blocks (duplex). The health probe is lenient (a CPU engine busy with a long
    prefill answers /health slowly)."""
    return {
        "conversation": {"keying": "id", "ttl_seconds": block_ttl - 40, "engine_blocks_ttl_seconds": block_ttl},
        "health_check": {"interval_seconds": 1.0, "timeout_seconds": 20.0},
        "timeouts": {"replay_prefill_seconds": 120.0},
        "placement": {"prefill": policy},
    }


def start_router(prefills: list[VllmEngine], decode: VllmEngine, policy: str, block_ttl: float) -> RouterProcess:
    router = RouterProcess(
        prefill=[p.url for p in prefills], decode=[decode.url], config=router_config(policy, block_ttl)
    )
    return router.start().wait_ready(60).wait_ready(60, path="/ready")  # up, then its engines healthy


@dataclass(frozen=True)
class Snapshot:
    """The counters of one moment."""

    decode_e2e_sum: float
    decode_ttft_sum: float
    decode_count: float
    per_prefill: tuple[
        tuple[float, float, float, float, float, float], ...
    ]  # external, local, computed, reads, read s, bytes

    @classmethod
    def take(cls, prefills: list[VllmEngine], decode: VllmEngine) -> Snapshot:
        d = decode.metrics()
        rows = []
        for p in prefills:
            m = p.metrics()

            def pm(name: str, m: list[processes.Sample] = m, **labels: str) -> float:
                return processes.metric_sum(m, name, **labels)

            rows.append(
                (
                    pm(EXTERNAL, source="external_kv_transfer"),
                    pm(EXTERNAL, source="local_cache_hit"),
                    pm(EXTERNAL, source="local_compute"),
                    pm("vllm:nixl_xfer_time_seconds_count"),
                    pm("vllm:nixl_xfer_time_seconds_sum"),
                    pm("vllm:nixl_bytes_transferred_sum"),
                )
            )
        return cls(
            processes.metric_sum(d, "vllm:e2e_request_latency_seconds_sum"),
            processes.metric_sum(d, "vllm:time_to_first_token_seconds_sum"),
            processes.metric_sum(d, "vllm:e2e_request_latency_seconds_count"),
            tuple(rows),
        )


def chat_body(
    messages: list[dict[str, Any]], max_tokens: int, tools: list[dict[str, Any]], tool_choice: str, salt: str
) -> dict[str, Any]:
    return {
        "model": served_model(),
        "messages": messages,
        "tools": tools,
        "tool_choice": tool_choice,
        "max_tokens": max_tokens,
        "temperature": 0,
        "cache_salt": salt,
    }


def warm(prefills: list[VllmEngine], body: dict[str, Any], prefix: list[dict[str, Any]]) -> None:
    """The oracle's untimed warm-up: each prefill engine computes exactly `prefix` (the history with the last reply,
    no generation prompt) under the turn's cache salt, so the timed turn finds all its full blocks in the local
    prefix cache and computes only the new suffix (plus the last partial block of the prefix). It goes to the engines
    directly, so it carries the engine key as the router would."""
    if not prefix:
        return
    warm_body = {**body, "messages": prefix, "max_tokens": 1, "add_generation_prompt": False}
    for p in prefills:
        post(p.url + "/v1/chat/completions", warm_body, headers=DEV_ENGINE_AUTH)


def measure(
    prefills: list[VllmEngine],
    decode: VllmEngine,
    router: RouterProcess,
    body: dict[str, Any],
    conversation_id: str | None,
) -> tuple[dict[str, Any], str]:
    """One turn through the router; the sample (timings and counter deltas) and the reply's text."""
    before = Snapshot.take(prefills, decode)
    send = {**body, "conversation_id": conversation_id} if conversation_id else body
    started = time.perf_counter()
    answer, headers = exchange(router.url + "/v1/chat/completions", send)
    wall = time.perf_counter() - started
    said = receipt.parse(headers.get("Server-Timing", ""))
    deadline = time.monotonic() + 10
    while True:  # decode's histograms are updated just after it answers
        after = Snapshot.take(prefills, decode)
        if after.decode_count > before.decode_count or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    if after.decode_count != before.decode_count + 1:
        raise TurnError(f"decode counted {after.decode_count - before.decode_count} requests for one turn")
    after_decode = (after.decode_e2e_sum - before.decode_e2e_sum) - (after.decode_ttft_sum - before.decode_ttft_sum)
    delta = [
        tuple(a - b for a, b in zip(pa, pb, strict=True))
        for pa, pb in zip(after.per_prefill, before.per_prefill, strict=True)
    ]
    served = [i for i, d in enumerate(delta) if d[0] + d[1] + d[2] > 0]
    usage = answer["usage"]
    sample = {
        "prompt_tokens": usage["prompt_tokens"],
        "completion_tokens": usage["completion_tokens"],
        "wall_s": wall,
        "ttft_s": wall - after_decode,
        "decode_ttft_s": after.decode_ttft_sum - before.decode_ttft_sum,
        "prefill_leg_s": said.prefill or 0.0,
        "router_s": said.router,
        "replayed": said.hit,
        "reused_tokens": said.tokens,
        "prefill_engine": served[0] if len(served) == 1 else None,
        "external_tokens": sum(d[0] for d in delta),
        "local_tokens": sum(d[1] for d in delta),
        "computed_tokens": sum(d[2] for d in delta),
        "reads": sum(d[3] for d in delta),
        "read_s": sum(d[4] for d in delta),
        "read_bytes": sum(d[5] for d in delta),
    }
    return sample, answer["choices"][0]["message"]["content"] or ""

"""Helpers of the realvllm tier: HTTP to the router and the engines, turns with vLLM's token ids, the counters that
say where a turn's KV came from, and the equality of a reused answer with a plain recompute."""

from __future__ import annotations

import json
import math
import time
import urllib.error
import urllib.request
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from duplex_dev import processes
from duplex_dev.chat import sse_events
from duplex_dev.launch.engine_key import DEV_ENGINE_AUTH
from duplex_dev.launch.router import RouterProcess
from duplex_dev.launch.vllm import EngineCommand, VllmEngine, rendered_engine, served_model

# decode's decoder_kv_blocks_ttl in this tier (seconds; rendered: 480): long enough that a test's next turn still finds
# its blocks (a turn takes about a second with each engine on a core of its own, conftest.engine_pair), short enough
# that the expiry test waits it out in a minute and a half.
DECODE_TTL = 90
EXTERNAL = "vllm:prompt_tokens_by_source_total"
# Observed on vLLM 0.32 (CPU build) in every run: after prefill declines (expired blocks) or fails (decode gone,
# NIXL_ERR_REMOTE_DISCONNECT) a D->P read, the worker logs "Skipping KV post-processing for failed request", and the
# request then stays in WAITING_FOR_REMOTE_KVS ("KV fetch: 1 in progress") instead of being recomputed under
# kv_load_failure_policy=recompute. The router abandons such a replaying prefill leg after
# timeouts.replay_prefill_seconds and recomputes: the tier's routers use the rendered 30 s. (Before the engines had
# a core each, a good replay took 20 s and more, and the tier needed 60.)
REPLAY_SECONDS = 30
STUCK_TURN_SECONDS = 240  # a turn this slow (the replay budget, then a recompute) is a hang, not a slow machine
# Starting one engine while the other runs takes minutes on 2 cores: 10 minutes in a CI run whose prefill held a
# stuck read (above), which steps prefill's engine core and worker on both cores.
RESTART_SECONDS = 900
LONG = "Please summarise the following report in detail, and answer every question in it. " * 4


def wait_ready_engines(router: RouterProcess, timeout: float = 60.0) -> None:
    """Until the router's /ready says both roles have a healthy engine."""
    deadline = time.monotonic() + timeout
    while True:
        status, _ = get(router.url + "/ready")
        if status == 200:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"router not ready after {timeout}s:\n{router.log_tail()}")
        time.sleep(0.2)


# -- HTTP ------------------------------------------------------------------------------------------------------


@dataclass
class Response:
    status: int
    raw: bytes
    headers: dict[str, str]

    @property
    def body(self) -> Any:
        return json.loads(self.raw)

    @property
    def events(self) -> list[Any]:
        return sse_events(self.raw)


# Engines of the session, which require the engine key on /v1 (rendered VLLM_API_KEY, the dev key here).
_KEYED: set[str] = set()


def keyed_engines(*engines: VllmEngine) -> None:
    _KEYED.update(e.url for e in engines)


def post(url: str, body: dict[str, Any], headers: dict[str, str] | None = None, timeout: float = 300) -> Response:
    """POST JSON. Without `headers`, a request straight to an engine carries the engine key as the router's legs do;
    `headers={}` sends none."""
    if headers is None and any(url.startswith(base + "/") for base in _KEYED):
        headers = DEV_ENGINE_AUTH
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"content-type": "application/json", **(headers or {})}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return Response(resp.status, resp.read(), dict(resp.headers))
    except urllib.error.HTTPError as err:
        return Response(err.code, err.read(), dict(err.headers))


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=30) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()
    except (urllib.error.URLError, OSError):
        return 0, b""


def calibration_legs(router: RouterProcess) -> dict[str, int]:
    """The prefill legs the router's calibration has sampled (/ready), of each kind."""
    status, body = get(router.url + "/ready")
    assert status == 200, body[:300]
    report = json.loads(body).get("calibration") or {}
    return {"recomputes": 0, "replays": 0, **report.get("legs", {})}


# -- turns -----------------------------------------------------------------------------------------------------


@dataclass
class Turn:
    """One non-streaming answer, with the token ids vLLM reports (`return_token_ids`)."""

    text: str
    token_ids: list[int]
    prompt_token_ids: list[int]
    usage: dict[str, int]
    logprobs: list[float]
    raw: bytes

    @classmethod
    def of(cls, resp: Response, route: str) -> Turn:
        assert resp.status == 200, f"HTTP {resp.status}: {resp.raw[:2000]!r}"
        body = resp.body
        choice = body["choices"][0]
        if route == "chat":
            text = choice["message"]["content"] or ""
            logprobs = [t["logprob"] for t in (choice.get("logprobs") or {}).get("content") or []]
            prompt_ids = body.get("prompt_token_ids")
        else:
            text = choice["text"]
            logprobs = list((choice.get("logprobs") or {}).get("token_logprobs") or [])
            prompt_ids = choice.get("prompt_token_ids")
        return cls(text, choice["token_ids"], prompt_ids or [], body["usage"], logprobs, resp.raw)


def chat_body(messages: list[dict[str, Any]], max_tokens: int = 16, **extra: Any) -> dict[str, Any]:
    return {
        "model": served_model(),
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "return_token_ids": True,
        "logprobs": True,
        **extra,
    }


def completion_body(prompt: str, max_tokens: int = 16, **extra: Any) -> dict[str, Any]:
    return {
        "model": served_model(),
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "return_token_ids": True,
        "logprobs": 1,
        **extra,
    }


def chat(
    base: str,
    messages: list[dict[str, Any]],
    conversation_id: str | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 300,
    **kw: Any,
) -> Turn:
    body = chat_body(messages, **kw)
    if conversation_id is not None:
        body["conversation_id"] = conversation_id
    return Turn.of(post(base + "/v1/chat/completions", body, headers, timeout=timeout), "chat")


def complete(base: str, prompt: str, conversation_id: str | None = None, **kw) -> Turn:
    body = completion_body(prompt, **kw)
    if conversation_id is not None:
        body["conversation_id"] = conversation_id
    return Turn.of(post(base + "/v1/completions", body), "completions")


@dataclass
class Counters:
    """vLLM's and the router's counters that say where a turn's KV came from, read before and after."""

    external: float  # prefill: prompt tokens whose KV came over NIXL (from decode)
    local_hit: float  # prefill: prompt tokens from its own prefix cache (0: prefix caching is off)
    reads: float  # prefill: NIXL reads it initiated (vllm:nixl_xfer_time_seconds_count)
    read_bytes: float  # prefill: bytes those reads moved
    declined: float  # prefill: reads declined because decode's blocks had (nearly) expired (its log, see below)
    failed: float  # prefill: failed NIXL transfers
    hits: float  # router: turns that replayed decode's blocks
    reused: float  # router: remote_num_tokens it replayed
    misses: dict[str, float]

    @classmethod
    def read(cls, prefill: VllmEngine, router: RouterProcess) -> Counters:
        p = prefill.metrics()
        r = processes.scrape(router.url + "/metrics", timeout=60)  # a router on 2 loaded cores can be slow to answer

        def pm(name: str, **labels: str) -> float:
            return processes.metric_sum(p, name, **labels)

        misses = {lbl["reason"]: v for n, lbl, v in r if n == "duplex_router_kv_reuse_misses_total" and "reason" in lbl}
        return cls(
            external=pm(EXTERNAL, source="external_kv_transfer"),
            local_hit=pm(EXTERNAL, source="local_cache_hit"),
            reads=pm("vllm:nixl_xfer_time_seconds_count"),
            read_bytes=pm("vllm:nixl_bytes_transferred_sum"),
            declined=float(declined_reads(prefill)),
            failed=pm("vllm:nixl_num_failed_transfers_total"),
            hits=processes.metric_sum(r, "duplex_router_kv_reuse_hits_total"),
            reused=processes.metric_sum(r, "duplex_router_kv_reused_tokens_total"),
            misses=misses,
        )

    def __sub__(self, before: Counters) -> Counters:
        return Counters(
            *(getattr(self, f) - getattr(before, f) for f in ("external", "local_hit", "reads", "read_bytes")),
            *(getattr(self, f) - getattr(before, f) for f in ("declined", "failed", "hits", "reused")),
            misses={k: v - before.misses.get(k, 0.0) for k, v in self.misses.items() if v - before.misses.get(k, 0.0)},
        )


# vllm:nixl_num_kv_expired_reqs counts these declines, and also prefill's own blocks whose lease (kv_lease_duration,
# 30 s as rendered) ran out before a decode read them, e.g. after a refused or abandoned decode leg in an earlier
# test: that lands at any time, in a later test's window (seen in CI). The log line is only the decline.
DECLINED = "Declining expired remote read"


def declined_reads(prefill: VllmEngine) -> int:
    """The reads prefill declined as expired so far (pull_worker logs each)."""
    with open(prefill.log_path, "rb") as log:
        return log.read().count(DECLINED.encode())


def block_size() -> int:
    """The --block-size the operator rendered for the engines (a CPU example's: a multiple of 32)."""
    return int(EngineCommand.parse(rendered_engine("prefill")).flags["--block-size"] or 0)


def block_bytes(model_dir: Path) -> int:
    """Bytes of one KV block of the model on the CPU engine: K and V of every layer, float32."""
    cfg = json.loads((model_dir / "config.json").read_text())
    return block_size() * cfg["num_hidden_layers"] * 2 * cfg["num_key_value_heads"] * cfg["head_dim"] * 4


def blocks(tokens: int) -> int:
    return math.ceil(tokens / block_size())


def assert_same_answer(reused: Turn, recomputed: Turn) -> None:
    assert reused.token_ids == recomputed.token_ids, "greedy output with decode's KV differs from recompute"
    assert reused.text == recomputed.text
    assert reused.prompt_token_ids == recomputed.prompt_token_ids
    # Not only the argmax: each chosen token's logprob agrees to float32 rounding.
    assert len(reused.logprobs) == len(recomputed.logprobs) == len(reused.token_ids)
    assert max(abs(a - b) for a, b in zip(reused.logprobs, recomputed.logprobs, strict=True)) < 1e-3


def assert_follow_ups_reused(delta: Counters, follow_ups: int) -> None:
    """Each of `follow_ups` turns replayed decode's blocks and prefill read every offered token over NIXL, except
    that vLLM 0.32 now and then leaves a replay's request waiting on prefill after its read (once in CI, an Anthropic
    client's follow-up: prefill idle, the leg abandoned at REPLAY_SECONDS): such a turn is a `prefill_retry` miss
    and the owed recompute answers. One follow-up at least must replay; a fallback is reported as a warning."""
    stuck = delta.misses.get("prefill_retry", 0.0)
    assert delta.hits >= 1 and delta.hits + stuck == follow_ups, delta
    assert delta.external == delta.reused > 0, delta  # a replay that answered read all it offered, nothing more
    if stuck:
        warnings.warn(f"{stuck:g} of {follow_ups} replays left waiting by vLLM and recomputed: {delta}", stacklevel=2)


def covered_tokens(previous: Turn) -> list[int]:
    """The token ids decode's retained blocks hold after `previous`: its prompt and all generated tokens but the
    last."""
    return previous.prompt_token_ids + previous.token_ids[:-1]

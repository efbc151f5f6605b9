"""Prefill placement under concurrent agentic load, 2P1D: least_outstanding, round_robin and cost, side by side.

    python bench/placement_bench.py            # 8, 16 and 32 conversations, 2 rounds (~25 min): bench/results/placement-<date>.*
    python bench/placement_bench.py --quick    # 4 conversations x 3 turns, 1 round; bench/results/tmp/ (ignored)

Engines are `duplex sim` processes (two prefill, one decode, real NIXL over UCX on loopback) running the cost model
fitted to real vLLM CPU engines (bench/results/sim-cost.json, bench/sim_cost_fit.py) `--time-scale` times faster: an
engine computes one prefill at a time, a read of decode's blocks has the fitted fixed part, prefix caching is on.
Every conversation runs its turns one after another with a tool's think time between them, all conversations at
once, so that turns overlap and queue. Each (size, round) runs every policy on fresh engines with the same
conversations and think times, in an order that rotates. Times are reported at the real engines' scale (measured
wall time divided by the time scale). See docs/benchmarks.md ("Placement benchmark").
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import random
import shlex
import sys
import time
from typing import Any

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
sys.path.insert(0, BENCH)

import procstat
import results_io
import ttft_stats as stats
import ttft_workload as workload

from duplex_dev.chat import read_stream
from duplex_dev.launch.router import RouterProcess
from duplex_dev.launch.sim import SimProcess
from duplex_sidecars.sim.cost import CostModel, load_profile

PROFILE = os.path.join(BENCH, "results", "sim-cost.json")
POLICIES = ("least_outstanding", "round_robin", "cost")
# The simulator's tokenizer makes about one token of a word where the bench model's makes two: doubling the words
# gives histories of the TTFT benchmark's length (~1k to ~5.5k tokens over 8 turns).
SHAPE = workload.Shape(system_words=300, request_words=80, tool_words=(340, 460))
QUICK = workload.Shape(turns=3, system_words=80, request_words=40, tool_words=(80, 160), reply_tokens=(8, 16))
BLOCK_SIZE = 16
_T0 = time.monotonic()


def say(msg: str) -> None:
    print(f"[{time.monotonic() - _T0:7.1f}s] {msg}", flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="4 conversations x 3 turns, 1 round, short histories")
    p.add_argument("--sizes", help="concurrent conversations, comma-separated (default 8,16,32; quick 4)")
    p.add_argument("--rounds", type=int, help="rounds per size (default 2; quick 1)")
    p.add_argument("--policies", default=",".join(POLICIES), help="placement.prefill policies to compare")
    p.add_argument("--seed", type=int, default=11, help="workload seed")
    p.add_argument("--profile", default=PROFILE, help="the simulator's cost profile")
    p.add_argument(
        "--read-back-latency-ms",
        help="fixed parts of a read back to run, comma-separated, each a variant of the profile; `profile` is the "
        "profile's own (the default)",
    )
    p.add_argument("--time-scale", type=float, default=0.1, help="simulated durations times this (default 0.1)")
    p.add_argument("--think", default="10,60", help="seconds between a reply and the next turn, a range (real scale)")
    p.add_argument("--stagger", type=float, default=60.0, help="conversations start within this many seconds")
    p.add_argument("--prefill-kv-gib", type=float, default=1.0, help="each prefill's KV cache (the TTFT bench's)")
    p.add_argument("--out", help="output stem (default bench/results/placement-<date>, quick: bench/results/tmp/)")
    args = p.parse_args(argv)
    args.sizes = [int(x) for x in (args.sizes or ("4" if args.quick else "8,16,32")).split(",")]
    args.rounds = args.rounds or (1 if args.quick else 2)
    args.policies = [x for x in args.policies.split(",") if x]
    unknown = sorted(set(args.policies) - set(POLICIES))
    if unknown:
        p.error(f"unknown policies {unknown}; known: {', '.join(POLICIES)}")
    if args.time_scale <= 0:
        p.error("--time-scale must be positive")
    lo, hi = (float(x) for x in args.think.split(","))
    args.think = (lo, hi)
    args.shape = QUICK if args.quick else SHAPE
    try:
        args.read_back_latency_ms = [
            None if x == "profile" else float(x) for x in (args.read_back_latency_ms or "profile").split(",") if x
        ]
    except ValueError:
        p.error(f"--read-back-latency-ms: milliseconds or `profile`, not {args.read_back_latency_ms!r}")
    return args


def engine_args(cost: CostModel, args: argparse.Namespace, role: str) -> list[str]:
    """KV capacity like the real engines' (16 KiB per token: 1 GiB per prefill, and a decode that keeps every
    conversation's blocks), but blocks of 256 B per token, so that copying and verifying them costs this process
    little real time (at a time scale of 0.1 it would count 10x); the transfer's simulated time keeps the fitted cost
    per token, its bandwidth scaled by the same 1/64."""
    real_token_bytes, token_bytes = 16_384, 256
    gib = args.prefill_kv_gib if role == "prefill" else max(3.0, 0.12 * max(args.sizes))
    blocks = int(gib * 2**30 // (real_token_bytes * BLOCK_SIZE))
    gbps = cost.transfer_gbps * token_bytes / real_token_bytes
    return [
        "--cost-profile", args.profile, "--time-scale", str(args.time_scale), "--transfer-gbps", f"{gbps:.6g}",
        "--read-back-latency-ms", f"{cost.read_back_latency_us / 1000:.6g}",
        "--block-size", str(BLOCK_SIZE), "--block-bytes", str(token_bytes * BLOCK_SIZE), "--num-blocks", str(blocks),
        "--kv-load-failure-policy", "recompute", "--log-level", "warning",
    ]  # fmt: skip


def router_config(policy: str, cost: CostModel, args: argparse.Namespace) -> dict[str, Any]:
    """`cost` starts from the profile's rates at the run's time scale (a token's compute at 2k tokens of context, a
    read's fixed part and its bytes), and takes the router's own calibration once that has a fit, as it does by
    default in a deployment."""
    s = args.time_scale
    return {
        "conversation": {"keying": "id"},
        "health_check": {"interval_seconds": 1.0, "timeout_seconds": 10.0},
        "placement": {
            "prefill": policy,
            "compute_ms_per_1k_tokens": cost.prefill_seconds(1000, 2000) * 1000 * s,
            "read_latency_ms": cost.read_back_latency_us / 1000 * s,
            "read_ms_per_1k_tokens": cost.transfer_seconds(1000 * 16_384) * 1000 * s,  # the fitted bytes per token
        },
    }


def plan(
    args: argparse.Namespace, size: int, rnd: int
) -> tuple[list[workload.Conversation], list[list[float]], list[float]]:
    """The conversations of one (size, round), their think times and start offsets: the same for every policy."""
    rng = random.Random(f"placement-{args.seed}-{size}-{rnd}")
    convs = workload.conversations(args.seed * 1000 + rnd, size, args.shape)
    thinks = [[rng.uniform(*args.think) for _ in range(args.shape.turns)] for _ in convs]
    starts = [rng.uniform(0, args.stagger) for _ in convs]
    return convs, thinks, starts


async def turn(http: Any, url: str, conv: workload.Conversation, index: int) -> dict[str, Any]:
    body = {
        "model": "sim", "messages": conv.request(index), "tools": workload.TOOLS, "tool_choice": workload.TOOL_CHOICE,
        "max_tokens": conv.plans[index].max_tokens, "stream": True, "stream_options": {"include_usage": True},
        "conversation_id": conv.name,
    }  # fmt: skip
    started = time.perf_counter()
    async with http.post(url + "/v1/chat/completions", json=body) as resp:
        if resp.status != 200:
            raise RuntimeError(f"{conv.name} turn {index}: HTTP {resp.status}: {(await resp.text())[:300]}")
        streamed = await read_stream(resp, started)
    first, text, usage = streamed.first, streamed.text, streamed.usage
    conv.record_reply(index, text)
    return {"conv": conv.name, "turn": index, "ttft_wall_s": first, "e2e_wall_s": time.perf_counter() - started,
            "prompt_tokens": usage.get("prompt_tokens", 0)}  # fmt: skip


async def drive(url: str, convs: list[workload.Conversation], thinks: list[list[float]], starts: list[float],
                scale: float) -> list[dict[str, Any]]:  # fmt: skip
    import aiohttp

    out: list[dict[str, Any]] = []

    async def one(i: int) -> None:
        await asyncio.sleep(starts[i] * scale)
        for index in range(len(convs[i].plans)):
            if index:
                await asyncio.sleep(thinks[i][index] * scale)
            out.append(await turn(http, url, convs[i], index))

    timeout = aiohttp.ClientTimeout(total=None, sock_read=600)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as http:
        await asyncio.gather(*(one(i) for i in range(len(convs))))
    return out


def ready(url: str) -> dict[str, Any]:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url + "/ready", timeout=10) as resp:
            return dict(json.loads(resp.read()))
    except urllib.error.HTTPError as err:
        return dict(json.loads(err.read()))


def prefill_tokens(prefills: list[SimProcess]) -> dict[str, float]:
    name = "vllm:prompt_tokens_by_source_total"
    return {
        source: sum(p.metric(name, source=source) for p in prefills)
        for source in ("local_compute", "local_cache_hit", "external_kv_transfer")
    }


def run_one(args: argparse.Namespace, cost: CostModel, policy: str, size: int, rnd: int) -> dict[str, Any]:
    convs, thinks, starts = plan(args, size, rnd)
    prefills = [SimProcess("prefill", *engine_args(cost, args, "prefill"), startup_timeout=60) for _ in range(2)]
    decode = SimProcess("decode", *engine_args(cost, args, "decode"), startup_timeout=60)
    engines = [*prefills, decode]
    try:
        for e in engines:
            e.start()
        for e in engines:
            e.wait_ready()
        config = router_config(policy, cost, args)
        with RouterProcess(prefill=[p.url for p in prefills], decode=[decode.url], config=config) as router:
            wall = time.perf_counter()
            turns = asyncio.run(drive(router.url, convs, thinks, starts, args.time_scale))
            wall = time.perf_counter() - wall
            hits = router.metric("duplex_router_kv_reuse_hits_total")
            placement = ready(router.url).get("placement")
        tokens = prefill_tokens(prefills)
    finally:
        for e in engines:
            e.stop()
    for t in turns:
        t["ttft_s"] = t["ttft_wall_s"] / args.time_scale
    return {"read_ms": cost.read_back_latency_us / 1000, "policy": policy, "size": size, "round": rnd, "wall_s": wall,
            "hits": hits, "tokens": tokens,
            "placement": placement, "turns": turns}  # fmt: skip


def summarise(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for read_ms, size in sorted({(r["read_ms"], r["size"]) for r in runs}):
        for policy in dict.fromkeys(r["policy"] for r in runs):
            mine = [r for r in runs if (r["read_ms"], r["size"], r["policy"]) == (read_ms, size, policy)]
            if not mine:
                continue
            follow = [t["ttft_s"] for r in mine for t in r["turns"] if t["turn"] > 0]
            every = [t["ttft_s"] for r in mine for t in r["turns"]]
            tokens = {k: sum(r["tokens"][k] for r in mine) for k in mine[0]["tokens"]}
            rows.append({
                "read_ms": read_ms, "size": size, "policy": policy, "runs": len(mine), "turns": len(every),
                "p50": stats.percentile(follow, 50), "p99": stats.percentile(follow, 99),
                "p50_all": stats.percentile(every, 50), "p99_all": stats.percentile(every, 99),
                "hits": sum(r["hits"] for r in mine), "follow_ups": len(follow), **tokens,
            })  # fmt: skip
    return rows


def targets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per read cost and size: is `cost` below each single policy at p50 and at p99 (follow-up turns)?"""
    out = []
    for read_ms, size in sorted({(r["read_ms"], r["size"]) for r in rows}):
        by = {r["policy"]: r for r in rows if (r["read_ms"], r["size"]) == (read_ms, size)}
        if "cost" not in by:
            continue
        for other in (p for p in by if p != "cost"):
            for q in ("p50", "p99"):
                out.append({"read_ms": read_ms, "size": size, "against": other, "quantile": q,
                            "cost": by["cost"][q], "other": by[other][q],
                            "met": by["cost"][q] < by[other][q]})  # fmt: skip
    return out


def markdown(doc: dict[str, Any]) -> str:
    c = doc["cost_model"]
    lines = [
        "# Prefill placement benchmark (2P1D, simulated engines with the CPU-fitted cost model)",
        "",
        f"`{doc['command']}`",
        "",
        f"Commit {doc['machine'].get('git_commit')}, {doc['machine'].get('cpu_model')}, started {doc['started']}, "
        f"{doc['wall_s'] / 60:.1f} min. Time scale {doc['time_scale']:g} (times below are at the real engines' "
        f"scale). Cost model: {c['prefill_us_per_token'] / 1000:.2f} ms per computed token plus "
        f"{c['prefill_attention_us_per_token2']:.3g} us per attention pair, a read back's fixed part "
        f"{c['read_back_latency_us'] / 1000:.0f} ms, {c['transfer_gbps']:.2f} Gbit/s, decode "
        f"{c['decode_us_per_token'] / 1000:.0f} ms per token. Think time {doc['think'][0]:g}-{doc['think'][1]:g} s.",
        "",
        "TTFT of follow-up turns (seconds), all runs of a size together:",
        "",
        "| read back fixed ms | conversations | policy | p50 | p99 | p50 all turns | p99 all turns | replayed | computed "
        "| local hits | read back |",
        "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in doc["rows"]:
        lines.append(
            f"| {r['read_ms']:.0f} | {r['size']} | {r['policy']} | {r['p50']:.2f} | {r['p99']:.2f} | {r['p50_all']:.2f} | "
            f"{r['p99_all']:.2f} | {r['hits']:.0f}/{r['follow_ups']} | {r['local_compute']:.0f} | "
            f"{r['local_cache_hit']:.0f} | {r['external_kv_transfer']:.0f} |"
        )
    lines += ["", "Target: `cost` below each single policy at p50 and p99:", "",
              "| read back fixed ms | conversations | against | quantile | cost | other | met |",
              "|---:|---:|---|---|---:|---:|---|"]  # fmt: skip
    for t in doc["targets"]:
        lines.append(f"| {t['read_ms']:.0f} | {t['size']} | {t['against']} | {t['quantile']} | {t['cost']:.2f} | {t['other']:.2f} | "
                     f"{'yes' if t['met'] else '**no**'} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    profile = load_profile(args.profile)
    variants = [
        profile if ms is None else profile.replace(read_back_latency_us=ms * 1000) for ms in args.read_back_latency_ms
    ]
    started = dt.datetime.now(dt.UTC)
    command = shlex.join(["python", "bench/placement_bench.py", *(argv if argv is not None else sys.argv[1:])])
    runs = []
    for cost in variants:
        for size in args.sizes:
            for rnd in range(args.rounds):
                for policy in stats.rotation(args.policies, size + rnd):
                    say(
                        f"read back fixed {cost.read_back_latency_us / 1000:.0f} ms, {size} conversations, round "
                        f"{rnd + 1}/{args.rounds}: {policy}"
                    )
                    run = run_one(args, cost, policy, size, rnd)
                    follow = [t["ttft_s"] for t in run["turns"] if t["turn"] > 0]
                    say(
                        f"  {len(run['turns'])} turns in {run['wall_s']:.0f} s; follow-up TTFT p50 "
                        f"{stats.percentile(follow, 50):.2f} s, p99 {stats.percentile(follow, 99):.2f} s; "
                        f"{run['hits']:.0f} replayed, {run['tokens']['external_kv_transfer']:.0f} tokens read back"
                    )
                    runs.append(run)
    rows = summarise(runs)
    doc = {
        "command": command, "machine": procstat.machine_facts(ROOT), "started": started.isoformat(timespec="seconds"),
        "wall_s": (dt.datetime.now(dt.UTC) - started).total_seconds(), "time_scale": args.time_scale,
        "think": args.think, "stagger": args.stagger, "profile": os.path.relpath(args.profile, ROOT),
        "cost_model": vars(profile),
        "read_back_latency_ms": [c.read_back_latency_us / 1000 for c in variants], "shape": vars(args.shape), "rows": rows, "targets": targets(rows), "runs": runs,
    }  # fmt: skip
    stem = args.out or os.path.join(results_io.RESULTS, *(["tmp"] if args.quick else []),
                                    f"placement-{started:%Y-%m-%d}{'-quick' if args.quick else ''}")  # fmt: skip
    results_io.write(stem, doc, markdown(doc))
    print(markdown(doc))
    say(f"wrote {stem}.md and .json")
    return 0


if __name__ == "__main__":
    sys.exit(main())

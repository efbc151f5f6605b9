"""Router benchmark: duplex's router against the floor (no router) and the vLLM project's Rust router on the same
simulated engines (zero compute delay), plus the memory and lookup cost of the router's conversation store.

    python bench/router_bench.py            # the full run (~15 min on 2 cores); writes bench/results/router-<date>.*
    python bench/router_bench.py --quick    # a short smoke run; writes bench/results/tmp/router-<date>-quick.*
    python bench/router_bench.py --jaeger --duplex-config 'tracing={"tracing": {"endpoint": "$JAEGER"}}'
                                            # also duplex's router with that config laid over its own: duplex+tracing

See docs/benchmarks.md for what is measured and how to read the numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from typing import Any

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
sys.path.insert(0, BENCH)

import aiohttp
import history_bench
import numpy as np
import procstat
import report
import results_io
from contenders import (
    DuplexRouter,
    Floor,
    VllmRouter,
    ensure_vllm_router,
    metric_sum,
    scrape,
)
from loadgen import Workload, run_cell

from duplex_dev.launch.sim import SimProcess
from duplex_dev.versions import version

CONTENDERS = ("floor", "floor-recompute", "duplex", "duplex-uvicorn", "vllm-router")
# What each contender's added latency is measured against: the floor doing the same engine work.
BASELINE = {"duplex": "floor", "duplex-uvicorn": "floor", "vllm-router": "floor-recompute"}
STORE_VARIANTS = ("as-written", "json-bytes", "array-u32", "delta-zlib")
_T0 = time.monotonic()


def say(msg: str) -> None:
    print(f"[{time.monotonic() - _T0:6.1f}s] {msg}", flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="short smoke run: 1 round, short windows, small store sizes")
    p.add_argument("--rounds", type=int, help="rounds over every cell (default 3; quick 1)")
    p.add_argument("--duration", type=float, help="measurement window per cell, seconds (default 3.5; quick 1.5)")
    p.add_argument("--warmup", type=float, help="unmeasured start of each cell, seconds (default 1; quick 0.3)")
    p.add_argument("--clients", default="1,16,64", help="concurrent clients per cell, comma-separated")
    p.add_argument("--modes", default="non-stream,stream", help="non-stream and/or stream")
    p.add_argument("--contenders", default=",".join(CONTENDERS), help="subset of " + ",".join(CONTENDERS))
    p.add_argument(
        "--latency-rounds",
        type=int,
        help="short 1-client cells per contender and mode for the added-latency measurement, contenders "
        "interleaved (default 24; quick 4; 0 skips it)",
    )
    p.add_argument("--latency-window", type=float, default=0.6, help="measurement window of each of those, seconds")
    p.add_argument(
        "--duplex-at",
        action="append",
        default=[],
        metavar="REV",
        help="also run duplex's router as of git revision REV (contender duplex@REV, against the same "
        "floor as duplex), for a before/after in one run; repeatable",
    )
    p.add_argument(
        "--duplex-config",
        action="append",
        default=[],
        metavar="NAME=JSON",
        help="also run duplex's router with JSON laid over its config (contender duplex+NAME, against the same floor "
        "as duplex), for a config's cost side by side; repeatable",
    )
    p.add_argument(
        "--jaeger",
        action="store_true",
        help="run a Jaeger v2 all-in-one (hack/build-tools.sh builds it) for the whole run; $JAEGER in a "
        "--duplex-config stands for its OTLP/HTTP URL",
    )
    w = p.add_argument_group("workload (per conversation)")
    w.add_argument("--turns", type=int, default=Workload.turns)
    w.add_argument("--system-words", type=int, default=Workload.system_words)
    w.add_argument("--user-words", type=int, default=Workload.user_words)
    w.add_argument("--reply-tokens", type=int, default=Workload.reply_tokens)
    e = p.add_argument_group("engines")
    e.add_argument("--num-blocks", type=int, default=200_000, help="KV blocks per simulated engine")
    e.add_argument("--block-bytes", type=int, default=256, help="bytes per KV block (the NIXL copy size)")
    e.add_argument(
        "--engine-blocks-ttl",
        type=float,
        default=30.0,
        help="decode's decoder_kv_blocks_ttl; short so that blocks nobody reads come back soon",
    )
    e.add_argument(
        "--kv-recompute-threshold",
        type=int,
        default=16,
        help="prefill's kv_recompute_threshold: pulls of fewer remote tokens are recomputed",
    )
    e.add_argument("--conversation-ttl", type=float, default=20.0, help="duplex router conversation TTL")
    e.add_argument(
        "--vllm-router-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="extra vllm-router flag (repeatable), e.g. --vllm-router-arg=--policy=round_robin",
    )
    s = p.add_argument_group("conversation store")
    s.add_argument(
        "--store-sizes", help="conversations per measurement (default 10000,100000,1000000; quick 1000,10000)"
    )
    s.add_argument("--store-blocks", type=int, default=2048, help="block ids per entry (32k tokens / block size 16)")
    s.add_argument(
        "--store-mem-cap-gib",
        type=float,
        default=3.0,
        help="largest RSS one store measurement may take; bigger ones are projected, not run",
    )
    s.add_argument("--store-variants", default=",".join(STORE_VARIANTS))
    p.add_argument("--history-sizes", help="history tokens for the per-request router work (default 1024,8192,32768)")
    p.add_argument("--skip-load", action="store_true", help="skip the load measurement")
    p.add_argument("--skip-store", action="store_true", help="skip the conversation store measurement")
    p.add_argument("--skip-history", action="store_true", help="skip the per-request work vs history length")
    p.add_argument("--no-install", action="store_true", help="fail instead of pip-installing vllm-router")
    p.add_argument(
        "--out", help="results path without extension (default bench/results/router-<date>, quick: bench/results/tmp/)"
    )
    args = p.parse_args(argv)
    args.rounds = args.rounds or (1 if args.quick else 3)
    if args.latency_rounds is None:
        args.latency_rounds = 4 if args.quick else 24
    args.duration = args.duration or (1.5 if args.quick else 3.5)
    args.warmup = args.warmup if args.warmup is not None else (0.3 if args.quick else 1.0)
    args.store_sizes = [
        int(x) for x in (args.store_sizes or ("1000,10000" if args.quick else "10000,100000,1000000")).split(",")
    ]
    args.history_sizes = [int(x) for x in (args.history_sizes or "1024,8192,32768").split(",")]
    args.clients = [int(x) for x in args.clients.split(",")]
    args.modes = [m.strip() for m in args.modes.split(",")]
    args.contenders = [c.strip() for c in args.contenders.split(",")]
    args.store_variants = [v.strip() for v in args.store_variants.split(",")]
    for c in args.contenders:
        if c not in CONTENDERS:
            p.error(f"unknown contender {c!r}")
    args.contenders += [f"duplex@{rev}" for rev in args.duplex_at]
    variants = {}
    for spec in args.duplex_config:
        name, _, text = spec.partition("=")
        try:
            overlay = json.loads(text)
        except ValueError as exc:
            p.error(f"--duplex-config {spec!r}: not NAME=JSON: {exc}")
        if not name.isidentifier() or not isinstance(overlay, dict):
            p.error(f"--duplex-config {spec!r}: expected NAME=JSON object, NAME a word")
        if "$JAEGER" in text and not args.jaeger:
            p.error(f"--duplex-config {spec!r} names $JAEGER: add --jaeger")
        variants[name] = overlay
    args.duplex_config = variants
    args.contenders += [f"duplex+{name}" for name in variants]
    for m in args.modes:
        if m not in ("non-stream", "stream"):
            p.error(f"unknown mode {m!r}")
    return args


# ---- load ---------------------------------------------------------------------------------------------------------


def _pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) * 1000 if values else None


def _ms(value: float | None) -> str:
    return f"{value:7.2f} ms" if value is not None else "      - ms"


async def _cell(
    contender: Any,
    session: aiohttp.ClientSession,
    workload: Workload,
    clients: int,
    stream: bool,
    args: argparse.Namespace,
    prefill: SimProcess,
    decode: SimProcess,
) -> dict[str, Any]:
    pid = contender.pid
    pids = {"router": pid, "prefill": prefill.process.pid, "decode": decode.process.pid, "loadgen": os.getpid()}
    cpu: dict[str, dict[str, float]] = {"start": {}, "end": {}}

    async def on_window(edge: str) -> None:
        cpu[edge] = {k: procstat.cpu_seconds(v) for k, v in pids.items() if v}
        cpu[edge]["machine"] = procstat.machine_busy_seconds()
        if pid:
            cpu[edge]["router_user"], cpu[edge]["router_sys"] = procstat.cpu_times(pid)

    router_url = getattr(contender, "metrics_url", None)
    before = await asyncio.gather(
        scrape(session, prefill.url + "/metrics"), scrape(session, router_url) if router_url else asyncio.sleep(0, {})
    )
    run = await run_cell(contender, session, workload, clients, stream, args.warmup, args.duration, on_window)
    after = await asyncio.gather(
        scrape(session, prefill.url + "/metrics"), scrape(session, router_url) if router_url else asyncio.sleep(0, {})
    )
    lat = [s.latency for s in run.samples]
    ttfb = [s.ttfb for s in run.samples]
    n = len(run.samples)
    used = {k: cpu["end"][k] - cpu["start"][k] for k in cpu["end"]}
    # CPU that processes outside the benchmark took from the machine during the window (other users' load).
    router_split = {k: used.pop(k) for k in ("router_user", "router_sys") if k in used}
    others = used.pop("machine") - sum(used.values())
    prefill_delta = {
        src: metric_sum(after[0], "vllm:prompt_tokens_by_source_total", source=src)
        - metric_sum(before[0], "vllm:prompt_tokens_by_source_total", source=src)
        for src in ("local_compute", "local_cache_hit", "external_kv_transfer")
    }
    skips = {}
    for (name, labels), value in after[0].items():
        if name == "sim_recompute_skips_total":
            reason = dict(labels).get("reason", "?")
            skips[reason] = value - before[0].get((name, labels), 0.0)
    out: dict[str, Any] = {
        "contender": contender.name,
        "stream": stream,
        "clients": clients,
        "requests": n,
        "followups_in_window": sum(1 for s in run.samples if s.turn > 0),
        "followups": run.followups,
        "errors": run.errors,
        "error_examples": run.error_examples,
        "req_s": n / args.duration,
        "p50_ms": _pct(lat, 50),
        "p90_ms": _pct(lat, 90),
        "p99_ms": _pct(lat, 99),
        "ttfb_p50_ms": _pct(ttfb, 50),
        "ttfb_p99_ms": _pct(ttfb, 99),
        "cpu_s": used,
        "others_cpu_cores": max(0.0, others) / args.duration,
        "router_cpu_per_1k_s": used["router"] / n * 1000 if pid and n else None,
        "router_user_sys_per_1k_s": [v / n * 1000 for v in router_split.values()] if pid and n else None,
        "router_rss_mib": procstat.rss_bytes(pid) / 2**20 if pid else None,
        "prefill_tokens": prefill_delta,
        "recompute_skips": {k: v for k, v in skips.items() if v},
    }
    if _family(contender.name) in ("duplex", "duplex-uvicorn"):  # duplex, duplex@REV, duplex+NAME, duplex-uvicorn
        hits = metric_sum(after[1], "duplex_router_kv_reuse_hits_total") - metric_sum(
            before[1], "duplex_router_kv_reuse_hits_total"
        )
        misses: dict[str, float] = {}
        for (name, labels), value in after[1].items():
            if name == "duplex_router_kv_reuse_misses_total":
                delta = value - before[1].get((name, labels), 0.0)
                if delta:
                    misses[dict(labels)["reason"]] = delta
        out["reuse"] = {"hits": hits, "misses": misses, "source": "router metrics (whole cell)"}
    elif contender.name == "floor":
        out["reuse"] = {
            "hits": run.replayed,
            "misses": {"first_turn": n - run.replayed},
            "source": "client-side replays (window)",
        }
        out["followups"] = out["followups_in_window"]
    else:
        out["reuse"] = {"hits": 0, "misses": {}, "source": f"no conversation reuse in {contender.name}"}
    reuse = out["reuse"]
    total = reuse["hits"] + sum(reuse["misses"].values())
    reuse["hit_ratio"] = reuse["hits"] / total if total else 0.0
    # First turns are misses by nature: the share of follow-up turns that replayed says whether reuse works.
    reuse["followup_hit_ratio"] = min(1.0, reuse["hits"] / out["followups"]) if out["followups"] else 0.0
    return out


async def run_load(
    args: argparse.Namespace, contenders: dict[str, Any], prefill: SimProcess, decode: SimProcess
) -> list[dict[str, Any]]:
    workload = Workload(
        turns=args.turns, system_words=args.system_words, user_words=args.user_words, reply_tokens=args.reply_tokens
    )
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60)
    cells: list[dict[str, Any]] = []
    total = args.rounds * len(args.modes) * len(args.clients) * len(args.contenders)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=120)) as session:
        # One short unmeasured pass per contender: connections, caches and imports warmed before round 1.
        for name in args.contenders:
            await run_cell(contenders[name], session, workload, 4, False, 0.0, 0.5)
        for rnd in range(args.rounds):
            order = args.contenders[rnd % len(args.contenders) :] + args.contenders[: rnd % len(args.contenders)]
            for mode in args.modes:
                for clients in args.clients:
                    for name in order:
                        cell = await _cell(
                            contenders[name], session, workload, clients, mode == "stream", args, prefill, decode
                        )
                        cell["round"] = rnd + 1
                        cells.append(cell)
                        say(
                            f"cell {len(cells)}/{total} round {rnd + 1} {mode:10s} {clients:3d} clients "
                            f"{name:11s} {cell['req_s']:7.1f} req/s  p50 {_ms(cell['p50_ms'])}  "
                            f"p99 {_ms(cell['p99_ms'])}  ttfb p50 {_ms(cell['ttfb_p50_ms'])}  "
                            + (
                                f"cpu/1k {cell['router_cpu_per_1k_s']:.2f} s  "
                                if cell["router_cpu_per_1k_s"] is not None
                                else ""
                            )
                            + f"reuse {cell['reuse']['hit_ratio']:.0%}  errors {cell['errors']}"
                        )
                        await asyncio.sleep(0.2)
        latency = await _latency_phase(args, contenders, session, workload)
    return cells, latency


async def _latency_phase(
    args: argparse.Namespace, contenders: dict[str, Any], session: aiohttp.ClientSession, workload: Workload
) -> list[dict[str, Any]]:
    """Added latency at 1 client, measured finely interleaved: many short cells, contenders in rotating order, so
    that the machine's drift (which moves a 1-client p50 by milliseconds within minutes) hits every contender alike.
    No CPU accounting or metrics scraping here: only client-side latency."""
    out: list[dict[str, Any]] = []
    names = args.contenders
    for rnd in range(args.latency_rounds):
        order = names[rnd % len(names) :] + names[: rnd % len(names)]
        for mode in args.modes:
            for name in order:
                run = await run_cell(contenders[name], session, workload, 1, mode == "stream", 0.2, args.latency_window)
                lat = [x.latency for x in run.samples]
                ttfb = [x.ttfb for x in run.samples]
                out.append(
                    {
                        "round": rnd + 1,
                        "stream": mode == "stream",
                        "contender": name,
                        "requests": len(lat),
                        "errors": run.errors,
                        "p50_ms": _pct(lat, 50),
                        "ttfb_p50_ms": _pct(ttfb, 50),
                    }
                )
        if (rnd + 1) % 4 == 0 or rnd + 1 == args.latency_rounds:
            say(f"latency: {rnd + 1}/{args.latency_rounds} interleaved 1-client rounds")
    return out


def summarize_latency(cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (mode, contender): the median and quartiles over rounds of (contender p50 - its floor's p50, same
    round)."""
    floors = {(c["contender"], c["round"], c["stream"]): c for c in cells if c["contender"].startswith("floor")}
    rows = []
    for stream in sorted({c["stream"] for c in cells}):
        for name in dict.fromkeys(c["contender"] for c in cells):
            if name.startswith("floor"):
                continue
            deltas, ttfb = [], []
            runs = [c for c in cells if c["contender"] == name and c["stream"] == stream]
            for c in runs:
                f = floors.get((_baseline(name) or "", c["round"], stream))
                if f and c["p50_ms"] is not None and f["p50_ms"] is not None:
                    deltas.append(c["p50_ms"] - f["p50_ms"])
                    ttfb.append(c["ttfb_p50_ms"] - f["ttfb_p50_ms"])
            if not deltas:
                continue
            q = np.percentile(deltas, [25, 50, 75])
            rows.append(
                {
                    "stream": stream,
                    "contender": name,
                    "baseline": _baseline(name),
                    "rounds": len(deltas),
                    "added_p50_ms": float(q[1]),
                    "added_p50_ms_q1": float(q[0]),
                    "added_p50_ms_q3": float(q[2]),
                    "added_ttfb_p50_ms": float(np.median(ttfb)),
                    "requests": sum(c["requests"] for c in runs),
                    "errors": sum(c["errors"] for c in runs),
                }
            )
    return rows


def _row(
    name: str,
    stream: bool,
    clients: int,
    runs: list[dict[str, Any]],
    floors: dict[tuple[str, int, bool, int], dict[str, Any]],
) -> dict[str, Any]:
    def med(key: str) -> float | None:
        vals = [r[key] for r in runs if r.get(key) is not None]
        return statistics.median(vals) if vals else None

    def deltas(key: str) -> list[float]:
        out = []
        for r in runs:
            floor = floors.get((_baseline(name) or "", r["round"], stream, clients))
            if floor is not None and r[key] is not None and floor[key] is not None:
                out.append(r[key] - floor[key])
        return out

    def added(key: str) -> float | None:
        values = deltas(key)
        return statistics.median(values) if values else None

    split = [r["router_user_sys_per_1k_s"] for r in runs if r.get("router_user_sys_per_1k_s")]
    return {
        "stream": stream,
        "clients": clients,
        "contender": name,
        "rounds": len(runs),
        "baseline": _baseline(name),
        "req_s": med("req_s"),
        "p50_ms": med("p50_ms"),
        "p99_ms": med("p99_ms"),
        "ttfb_p50_ms": med("ttfb_p50_ms"),
        "ttfb_p99_ms": med("ttfb_p99_ms"),
        "added_p50_ms": added("p50_ms"),
        "added_ttfb_p50_ms": added("ttfb_p50_ms"),
        "added_p50_ms_rounds": deltas("p50_ms"),
        "router_cpu_per_1k_s": med("router_cpu_per_1k_s"),
        "router_user_per_1k_s": statistics.median(u for u, _ in split) if split else None,
        "router_sys_per_1k_s": statistics.median(s for _, s in split) if split else None,
        "router_rss_mib": max((r["router_rss_mib"] for r in runs if r["router_rss_mib"]), default=None),
        "hit_ratio": statistics.median(r["reuse"]["hit_ratio"] for r in runs),
        "followup_hit_ratio": statistics.median(r["reuse"]["followup_hit_ratio"] for r in runs),
        "external_kv_tokens": sum(r["prefill_tokens"]["external_kv_transfer"] for r in runs),
        "requests": sum(r["requests"] for r in runs),
        "errors": sum(r["errors"] for r in runs),
        "others_cpu_cores": med("others_cpu_cores"),
    }


def summarize(cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Medians over rounds per (mode, clients, contender); added latency from per-round deltas to the floor."""
    floors = {
        (c["contender"], c["round"], c["stream"], c["clients"]): c for c in cells if c["contender"].startswith("floor")
    }
    groups: dict[tuple[bool, int, str], list[dict[str, Any]]] = {}
    for c in cells:
        groups.setdefault((c["stream"], c["clients"], c["contender"]), []).append(c)
    rows = [_row(name, stream, clients, runs, floors) for (stream, clients, name), runs in groups.items()]
    order = {n: i for i, n in enumerate(CONTENDERS)}
    rows.sort(key=lambda r: (r["stream"], r["clients"], order.get(_family(r["contender"]), len(order)), r["contender"]))
    return rows


def _baseline(name: str) -> str | None:
    return BASELINE.get(_family(name))


def _family(name: str) -> str:
    """The contender a variant is of: duplex for duplex@REV and duplex+NAME."""
    return name.split("@")[0].split("+")[0]


def export_revision(rev: str, into: str) -> str:
    """The operator and sidecars packages as of git revision `rev`, exported under `into`; returns a PYTHONPATH
    that makes `python -m duplex.cli` run them."""
    tree = os.path.join(into, f"duplex-{rev}")
    os.makedirs(tree)
    archive = subprocess.run(
        ["git", "-C", ROOT, "archive", rev, "operator", "sidecars"], capture_output=True, check=False
    )
    if archive.returncode != 0:
        raise SystemExit(f"--duplex-at {rev}: git archive failed: {archive.stderr.decode(errors='replace')}")
    subprocess.run(["tar", "-x", "-C", tree], input=archive.stdout, check=True)
    return os.pathsep.join([os.path.join(tree, "sidecars"), os.path.join(tree, "operator")])


# ---- store --------------------------------------------------------------------------------------------------------


def _store_run(size: int, variant: str, params: str, ids: str, blocks: int, timeout: float) -> dict[str, Any]:
    cmd = [
        sys.executable,
        os.path.join(BENCH, "store_bench.py"),
        "--size",
        str(size),
        "--variant",
        variant,
        "--params",
        params,
        "--ids",
        ids,
        "--blocks",
        str(blocks),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{shlex.join(cmd)} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_store(args: argparse.Namespace) -> dict[str, Any]:
    cap = args.store_mem_cap_gib * 2**30
    cap = min(cap, procstat.mem_available_bytes() * 0.6)
    results: list[dict[str, Any]] = []
    per_conv: dict[str, float] = {}  # last measured bytes/conversation with real payload, by variant

    def run(size: int, variant: str, params: str, ids: str = "churned") -> dict[str, Any]:
        say(f"store: {variant:10s} {size:>9,} conversations ({params} params, {ids} ids) ...")
        r = _store_run(size, variant, params, ids, args.store_blocks, timeout=900)
        say(
            f"store: {variant:10s} {size:>9,} -> {r['bytes_per_conversation']:>9,.0f} B/conversation, "
            f"put {r['put_us']:.1f} us, take {r['take_us']:.1f} us (fill {r['fill_seconds']} s)"
        )
        results.append(r)
        return r

    for size in args.store_sizes:
        for variant in args.store_variants:
            estimate = per_conv.get(variant, 90_000 if variant == "as-written" else 16_000) * size
            if variant == "as-written":
                # Structure and timing always; the block-id payload only where it fits (else it is projected).
                shared = run(size, variant, "shared")
                if estimate <= cap:
                    full = run(size, variant, "unique")
                    per_conv[variant] = full["bytes_per_conversation"]
                    payload = full["bytes_per_conversation"] - shared["bytes_per_conversation"]
                    per_conv["as-written-payload"] = payload
                else:
                    payload = per_conv.get("as-written-payload")
                    say(
                        f"store: as-written {size:,} not run with real payload: ~{estimate / 2**30:.1f} GiB "
                        f"exceeds the {cap / 2**30:.1f} GiB cap; projected"
                    )
                    results.append(
                        {
                            **shared,
                            "params": "projected",
                            "bytes_per_conversation": (shared["bytes_per_conversation"] + payload)
                            if payload is not None
                            else None,
                            "projected_from": "structure measured at this size + block-id payload "
                            "measured at the largest size that fit",
                        }
                    )
            elif estimate <= cap:
                r = run(size, variant, "shared")
                per_conv[variant] = r["bytes_per_conversation"]
            else:
                say(f"store: {variant} {size:,} skipped: ~{estimate / 2**30:.1f} GiB exceeds the cap")
    # The worst case for compact encodings: block ids with no runs at all.
    smallest = min(args.store_sizes)
    for variant in args.store_variants:
        if variant != "as-written":
            run(smallest, variant, "shared", ids="random")
    return {"results": results, "cap_gib": round(cap / 2**30, 2), "blocks": args.store_blocks}


# ---- main ---------------------------------------------------------------------------------------------------------


def _command() -> str:
    exe = sys.executable
    rel = os.path.relpath(exe, ROOT)
    return shlex.join([rel if not rel.startswith("..") else exe, *sys.argv])


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even when started with SIGINT ignored
    started = dt.datetime.now(dt.UTC)
    meta: dict[str, Any] = {
        "command": _command(),
        "started_utc": started.isoformat(timespec="seconds"),
        "machine": procstat.machine_facts(ROOT),
        "loadavg_start": os.getloadavg(),
        "quick": args.quick,
    }
    say(f"router benchmark: {meta['command']}")
    say(
        f"machine: {meta['machine']['nproc']} CPUs ({meta['machine']['cpu_model']}), python "
        f"{meta['machine']['python']}, load average {meta['loadavg_start'][0]:.2f}"
    )
    load: dict[str, Any] = {}
    if not args.skip_load:
        if "vllm-router" in args.contenders:
            meta["machine"]["vllm_router"] = ensure_vllm_router(install=not args.no_install)
        engine_args = [
            "--num-blocks",
            str(args.num_blocks),
            "--block-bytes",
            str(args.block_bytes),
            "--decoder-kv-blocks-ttl",
            str(args.engine_blocks_ttl),
            "--kv-lease-duration",
            "30",
            "--log-level",
            "warning",
        ]
        load["settings"] = {
            "rounds": args.rounds,
            "duration_s": args.duration,
            "warmup_s": args.warmup,
            "clients": args.clients,
            "modes": args.modes,
            "contenders": args.contenders,
            "workload": {
                "turns": args.turns,
                "system_words": args.system_words,
                "user_words": args.user_words,
                "reply_tokens": args.reply_tokens,
            },
            # A 32-token reply is worth pulling: below vLLM's default threshold of 64 prefill would recompute it.
            "prefill_args": [
                *engine_args,
                "--kv-load-failure-policy",
                "recompute",
                "--kv-recompute-threshold",
                str(args.kv_recompute_threshold),
            ],
            "decode_args": engine_args,
            "duplex_router": {
                "conversation_ttl_s": args.conversation_ttl,
                "engine_blocks_ttl_s": args.engine_blocks_ttl,
            },
        }
        with ExitStack() as stack:
            say("starting the simulated engines (prefill, decode) ...")
            prefill = SimProcess("prefill", *load["settings"]["prefill_args"], startup_timeout=60)
            decode = SimProcess("decode", *engine_args, startup_timeout=60)
            stack.callback(decode.stop)
            stack.callback(prefill.stop)
            prefill.start(), decode.start()
            prefill.wait_ready(), decode.wait_ready()
            contenders: dict[str, Any] = {
                "floor": Floor(prefill.url, decode.url),
                "floor-recompute": Floor(prefill.url, decode.url, reuse=False),
            }
            if "duplex" in args.contenders:
                contenders["duplex"] = DuplexRouter(
                    prefill.url, decode.url, args.conversation_ttl, args.engine_blocks_ttl
                )
            if "duplex-uvicorn" in args.contenders:  # the same router, served by uvicorn (hack/duplex_dev)
                contenders["duplex-uvicorn"] = DuplexRouter(
                    prefill.url,
                    decode.url,
                    args.conversation_ttl,
                    args.engine_blocks_ttl,
                    name="duplex-uvicorn",
                    entry=["-m", "duplex_dev.uvicorn_front"],
                )
            if args.duplex_at:
                trees = stack.enter_context(tempfile.TemporaryDirectory(prefix="duplex-bench-"))
                load["settings"]["duplex_at"] = {}
                for rev in args.duplex_at:
                    commit = (
                        subprocess.run(
                            ["git", "-C", ROOT, "rev-parse", "--short", rev],
                            capture_output=True,
                            text=True,
                            check=False,
                        ).stdout.strip()
                        or rev
                    )
                    say(f"exporting duplex's router at {rev} ({commit}) ...")
                    contenders[f"duplex@{rev}"] = DuplexRouter(
                        prefill.url,
                        decode.url,
                        args.conversation_ttl,
                        args.engine_blocks_ttl,
                        name=f"duplex@{rev}",
                        pythonpath=export_revision(rev, trees),
                    )
                    load["settings"]["duplex_at"][rev] = commit
            if args.jaeger:
                from duplex_dev.launch.jaeger import JaegerProcess, jaeger_binary

                say(f"starting Jaeger ({jaeger_binary()}) ...")
                jaeger = stack.enter_context(JaegerProcess())
                load["settings"]["jaeger"] = {"version": version("JAEGER_VERSION"), "otlp": jaeger.otlp_url}
            for name, overlay in args.duplex_config.items():
                if args.jaeger:
                    overlay = json.loads(json.dumps(overlay).replace("$JAEGER", jaeger.otlp_url))
                contenders[f"duplex+{name}"] = DuplexRouter(
                    prefill.url,
                    decode.url,
                    args.conversation_ttl,
                    args.engine_blocks_ttl,
                    name=f"duplex+{name}",
                    config=overlay,
                )
                load["settings"].setdefault("duplex_config", {})[name] = overlay
            if "vllm-router" in args.contenders:
                contenders["vllm-router"] = VllmRouter(prefill.url, decode.url, args.vllm_router_arg)
                load["settings"]["vllm_router_command"] = shlex.join(contenders["vllm-router"].command())
            for c in contenders.values():
                if hasattr(c, "start"):
                    stack.callback(c.stop)
                    c.start()
            for c in contenders.values():
                if hasattr(c, "wait_ready"):
                    c.wait_ready()
            say(
                f"engines {prefill.url} {decode.url}; routers "
                + ", ".join(f"{n} {c.url} (pid {c.pid})" for n, c in contenders.items() if c.pid)
            )
            cells, latency = asyncio.run(run_load(args, contenders, prefill, decode))
            load["cells"] = cells
            load["summary"] = summarize(cells)
            load["latency"] = {
                "rounds": args.latency_rounds,
                "window_s": args.latency_window,
                "warmup_s": 0.2,
                "cells": latency,
                "summary": summarize_latency(latency),
            }
            load["engine_errors"] = {
                "prefill_failed_kv_loads": prefill.metric("vllm:nixl_num_failed_transfers_total"),
                "decode_failed_kv_loads": decode.metric("vllm:nixl_num_failed_transfers_total"),
                "prefill_corrupt_blocks": prefill.metric("sim_corrupt_blocks_total"),
            }
        say("engines and routers stopped")
    store = run_store(args) if not args.skip_store else {}
    history: list[dict[str, Any]] = []
    if not args.skip_history:
        for tokens in args.history_sizes:
            history += history_bench.run([tokens], budget=0.1 if args.quick else 0.5)
            say(f"history: {tokens:,} tokens -> {history[-1]['total_us']:,.0f} us of router work per request")
    meta["finished_utc"] = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    meta["loadavg_end"] = os.getloadavg()
    results = {"meta": meta, "load": load, "store": store, "history": history}
    results["targets"] = report.targets(results)
    # A quick run goes to results/tmp/ (ignored by git): at the top level it would retire the committed results.
    out = args.out or os.path.join(
        BENCH,
        "results",
        *(["tmp"] if args.quick else []),
        f"router-{started.date().isoformat()}" + ("-quick" if args.quick else ""),
    )
    markdown = report.markdown(results)
    results_io.write(out, results, markdown)
    print(markdown)
    say(f"wrote {os.path.relpath(out, ROOT)}.md and .json")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("interrupted; processes stopped", file=sys.stderr)
        sys.exit(130)

"""The results file: pass/fail against the issue's targets, and the markdown tables."""

from __future__ import annotations

import json
import math
from typing import Any

GIB = 2**30
MILLION = 1_000_000
STORE_TARGET_BYTES = 2 * GIB

_VARIANT_NOTES = {
    "as-written": "router's MemoryStore with Entry objects (params as Python dicts/lists)",
    "json-bytes": "prototype: whole entry as compact JSON bytes (Entry.to_json)",
    "array-u32": "prototype: params JSON bytes + block ids as array('I')",
    "delta-zlib": "prototype: params JSON bytes + block-id deltas, int32, zlib level 1",
}


def _mode(stream: bool) -> str:
    return "streaming" if stream else "non-streaming"


def _store_at_million(store: dict[str, Any], variant: str) -> tuple[float | None, str]:
    """Bytes for 1M conversations: measured at 1M when available, else scaled from the largest size."""
    rows = [
        r
        for r in store.get("results", [])
        if r["variant"] == variant
        and r["ids"] == "churned"
        and r.get("bytes_per_conversation") is not None
        and (variant != "as-written" or r["params"] in ("unique", "projected"))
    ]
    if not rows:
        return None, "not measured"
    best = max(rows, key=lambda r: r["size"])
    how = "measured" if best["params"] != "projected" else "projected"
    if best["size"] != MILLION:
        how += f" at {best['size']:,}, scaled to 1M"
    return best["bytes_per_conversation"] * MILLION, how


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    summary = results.get("load", {}).get("summary", [])
    by = {(r["stream"], r["clients"], r["contender"]): r for r in summary}
    interleaved = {
        (r["stream"], r["contender"]): r for r in results.get("load", {}).get("latency", {}).get("summary", [])
    }
    for stream in (False, True):
        # The finely interleaved measurement when the run has it; else the main cells' per-round deltas.
        lat = interleaved.get((stream, "duplex"))
        r = lat or by.get((stream, 1, "duplex"))
        if r and r["added_p50_ms"] is not None:
            rust = interleaved.get((stream, "vllm-router")) if lat else by.get((stream, 1, "vllm-router"))
            context = (
                f" (vllm-router over its floor: {rust['added_p50_ms']:+.2f} ms)"
                if rust and rust["added_p50_ms"] is not None
                else ""
            )
            how = f"; median of {lat['rounds']} interleaved rounds" if lat else ""
            out.append(
                {
                    "target": f"added p50 latency over the floor at 1 client <= 1 ms ({_mode(stream)})",
                    "value": f"{r['added_p50_ms']:+.2f} ms{context}{how}",
                    "pass": r["added_p50_ms"] <= 1.0,
                }
            )
    for stream in (False, True):
        for clients in (16, 64):
            d, v = by.get((stream, clients, "duplex")), by.get((stream, clients, "vllm-router"))
            if d and v and v["req_s"]:
                ratio = d["req_s"] / v["req_s"]
                out.append(
                    {
                        "target": f"throughput at {clients} clients >= 1/2 of vllm-router ({_mode(stream)})",
                        "value": f"{d['req_s']:.0f} vs {v['req_s']:.0f} req/s ({ratio:.2f}x)",
                        "pass": ratio >= 0.5,
                    }
                )
    duplex = [r for r in summary if r["contender"] == "duplex"]
    if duplex:
        worst = max(duplex, key=lambda r: r["router_cpu_per_1k_s"] or 0.0)
        lowest_hit = min(r["followup_hit_ratio"] for r in duplex)
        external = sum(r["external_kv_tokens"] for r in duplex)
        reuse_ok = lowest_hit > 0 and external > 0
        out.append(
            {
                "target": "router CPU per 1k requests <= 1 s, with reuse working",
                "value": f"worst {worst['router_cpu_per_1k_s']:.2f} s ({_mode(worst['stream'])}, "
                f"{worst['clients']} clients); follow-up turns replayed: at least {lowest_hit:.0%}; "
                f"{external:,.0f} prompt tokens read from decode over NIXL",
                "pass": (worst["router_cpu_per_1k_s"] or 0.0) <= 1.0 and reuse_ok,
            }
        )
    store = results.get("store") or {}
    if store.get("results"):
        total, how = _store_at_million(store, "as-written")
        if total is not None:
            out.append(
                {
                    "target": "1M conversations (2048 block ids each) under 2 GiB, store as written",
                    "value": f"{total / GIB:,.1f} GiB ({how})",
                    "pass": total <= STORE_TARGET_BYTES,
                }
            )
        fits = []
        for variant in ("json-bytes", "array-u32", "delta-zlib"):
            t, how = _store_at_million(store, variant)
            if t is not None:
                fits.append(f"{variant} {t / GIB:.2f} GiB")
        if fits:
            best = min(
                (
                    (v, _store_at_million(store, v)[0])
                    for v in ("json-bytes", "array-u32", "delta-zlib")
                    if _store_at_million(store, v)[0] is not None
                ),
                key=lambda x: x[1],
            )
            out.append(
                {
                    "target": "1M conversations under 2 GiB, with a compact entry (prototype, not the router)",
                    "value": "; ".join(fits),
                    "pass": best[1] <= STORE_TARGET_BYTES,
                }
            )
    return out


def _f(value: Any, fmt: str = "{:.2f}", none: str = "-") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return none
    return fmt.format(value)


def _latency_table(latency: dict[str, Any]) -> list[str]:
    rows = latency.get("summary") or []
    if not rows:
        return []
    lines = [
        "### Added latency at 1 client, interleaved",
        "",
        (
            f"{latency['rounds']} rounds; in each, every contender runs one 1-client cell ({latency['warmup_s']} s "
            f"warm-up + {latency['window_s']} s window) per mode, in an order rotated every round, so that drift "
            "of the machine's speed hits all contenders alike. *added* = median over rounds of (contender p50 - "
            "its floor's p50 in the same round), with the quartiles; the main tables' 1-client cells are 3 "
            "rounds of longer windows, minutes apart."
        ),
        "",
        "| mode | contender | rounds | added p50 ms (quartiles) | added TTFB p50 ms | requests | errors |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {_mode(r['stream'])} | {r['contender']} | {r['rounds']} | {r['added_p50_ms']:+.2f} "
            f"({r['added_p50_ms_q1']:+.2f} .. {r['added_p50_ms_q3']:+.2f}) | {r['added_ttfb_p50_ms']:+.2f} | "
            f"{r['requests']:,} | {r['errors']} |"
        )
    return lines + [""]


def _added(r: dict[str, Any]) -> str:
    rounds = r.get("added_p50_ms_rounds") or []
    if r.get("added_p50_ms") is None:
        return "-"
    spread = f" ({min(rounds):+.1f} .. {max(rounds):+.1f})" if len(rounds) > 1 else ""
    return f"{r['added_p50_ms']:+.2f}{spread}"


def _cpu(r: dict[str, Any]) -> str:
    if r.get("router_cpu_per_1k_s") is None:
        return "-"
    split = ""
    if r.get("router_user_per_1k_s") is not None:
        split = f" ({r['router_user_per_1k_s']:.2f} + {r['router_sys_per_1k_s']:.2f})"
    return f"{r['router_cpu_per_1k_s']:.2f}{split}"


def _load_tables(load: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    summary = load.get("summary", [])
    for stream in (False, True):
        rows = [r for r in summary if r["stream"] == stream]
        if not rows:
            continue
        lines += [
            f"### {_mode(stream).capitalize()}",
            "",
            (
                "| clients | contender | req/s | p50 ms | p99 ms | TTFB p50 ms | TTFB p99 ms | added p50 ms (rounds min .. max) | "
                "added TTFB p50 ms | router CPU s / 1k req (user + sys) | router RSS MiB | reuse hit ratio "
                "(of follow-ups) | prompt tokens via KV transfer | errors | others' CPU (cores) |"
            ),
            "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in rows:
            lines.append(
                f"| {r['clients']} | {r['contender']} | {_f(r['req_s'], '{:.0f}')} | {_f(r['p50_ms'])} | "
                f"{_f(r['p99_ms'])} | {_f(r['ttfb_p50_ms'])} | {_f(r['ttfb_p99_ms'])} | "
                f"{_added(r)} | {_f(r['added_ttfb_p50_ms'], '{:+.2f}')} | "
                f"{_cpu(r)} | {_f(r['router_rss_mib'], '{:.0f}')} | "
                f"{r['hit_ratio']:.0%} ({r['followup_hit_ratio']:.0%}) | {r['external_kv_tokens']:,.0f} | "
                f"{r['errors']} | {_f(r.get('others_cpu_cores'), '{:.2f}')} |"
            )
        lines.append("")
    return lines


def _store_table(store: dict[str, Any]) -> list[str]:
    lines = [
        (
            "| conversations | variant | block ids | bytes / conversation | total GiB | put us | take us | "
            "how measured |"
        ),
        "|---:|---|---|---:|---:|---:|---:|---|",
    ]
    rows = sorted(store["results"], key=lambda r: (r["ids"] != "churned", r["size"], r["variant"], r["params"]))
    for r in rows:
        if r["variant"] == "as-written" and r["params"] == "shared":
            how = "structure only (entries share one block-id list); timing"
        elif r["params"] == "projected":
            how = "projected: " + r.get("projected_from", "")
        elif r["variant"] == "as-written":
            how = "measured (RSS delta, each entry parsed from JSON)"
        else:
            how = "measured (RSS delta)"
        bpc = r.get("bytes_per_conversation")
        total = bpc * r["size"] / GIB if bpc is not None else None
        lines.append(
            f"| {r['size']:,} | {r['variant']} | {r['ids']} (mean run {r['mean_run']}) | "
            f"{_f(bpc, '{:,.0f}')} | {_f(total, '{:,.2f}')} | {_f(r['put_us'], '{:.1f}')} | "
            f"{_f(r['take_us'], '{:.1f}')} | {how} |"
        )
    lines += [
        "",
        "Variants: " + "; ".join(f"**{k}**: {v}" for k, v in _VARIANT_NOTES.items()) + ".",
        (
            "put = build the entry from decode's parsed params (encoding included) + `MemoryStore.put`; "
            "take = `MemoryStore.take` + the prefill leg's replay params (decoding included); "
            f"both at steady state with the store holding that many conversations. Memory cap for one "
            f"measurement: {store.get('cap_gib')} GiB."
        ),
        "",
    ]
    return lines


def markdown(results: dict[str, Any]) -> str:
    meta, load, store = results["meta"], results.get("load") or {}, results.get("store") or {}
    m = meta["machine"]
    lines = [
        f"# Router benchmark {meta['started_utc'][:10]}" + (" (quick smoke run)" if meta.get("quick") else ""),
        "",
        f"Command: `{meta['command']}`",
        "",
        f"- Started {meta['started_utc']}, finished {meta.get('finished_utc')} (UTC)",
        (
            f"- Machine: nproc {m['nproc']} ({m['cpus_usable']} usable), {m['cpu_model']}, {m['mem_total_gib']} GiB, "
            f"kernel {m['kernel']}"
        ),
        f"- Python {m['python']}, aiohttp {m['aiohttp']}, httptools {m.get('httptools', '-')}, vllm-router {m['vllm_router']}, duplex commit "
        f"{m['git_commit']}" + (" (sidecars/ has uncommitted changes)" if m.get("sidecars_dirty") else ""),
        (
            f"- Load average at start {meta['loadavg_start'][0]:.2f}, at end {meta.get('loadavg_end', [0])[0]:.2f} "
            "(everything - load generator, engines, routers - shares this machine)"
        ),
        "",
    ]
    if load:
        s = load["settings"]
        w = s["workload"]
        lines += [
            "## Load",
            "",
            f"{s['rounds']} round(s); each cell {s['warmup_s']} s warm-up + {s['duration_s']} s window; contenders "
            "alternate within each round (order rotated per round); medians over rounds. Closed-loop clients, each "
            f"running conversations of {w['turns']} turns that resend the whole history (shared {w['system_words']}"
            f"-word system prompt, {w['user_words']}-word user/tool messages, replies of exactly "
            f"{w['reply_tokens']} tokens) with a `conversation_id`. Engines: `duplex sim`, zero compute delay, "
            f"prefill `{' '.join(s['prefill_args'])}`, decode `{' '.join(s['decode_args'])}`. "
            f"duplex router: conversation TTL {s['duplex_router']['conversation_ttl_s']} s. "
            + (f"vllm-router: `{s['vllm_router_command']}`." if s.get("vllm_router_command") else "")
            + "".join(
                f" duplex+{name}: duplex's router with `{json.dumps(overlay)}` laid over its config."
                for name, overlay in (s.get("duplex_config") or {}).items()
            )
            + (f" Jaeger v2 ({s['jaeger']['version']}) all-in-one, in-memory storage." if s.get("jaeger") else ""),
            "",
            (
                "*floor* = no router: the load generator runs both legs itself (protocol.py bodies, same HTTP "
                "client) and replays decode's blocks itself, so the engines do the same work as behind duplex. "
                "*floor-recompute* = the same without replaying (every prefill leg carries the miss payload), the "
                "engine work behind vllm-router, which has no conversation reuse. *added* = median over rounds of "
                "(contender - its floor) in the same round: duplex against *floor*, vllm-router against "
                "*floor-recompute*. With zero compute delay a replay saves nothing and costs a side-channel claim and a "
                "NIXL read, so the reuse path is slower here than recomputing; compare each router with its own floor. "
                "*Reuse hit ratio*: duplex from its metrics, hits / (hits + misses); every conversation's first turn is a "
                "miss, so the ceiling is below "
                f"{(w['turns'] - 1) / w['turns']:.0%} (cells start with every client on a new conversation); in "
                "parentheses hits / follow-up turns, which is 100% when reuse works. *prompt tokens via KV transfer*: "
                'the prefill engine\'s `vllm:prompt_tokens_by_source_total{source="external_kv_transfer"}`, summed '
                "over rounds (> 0 proves prefill really read decode's blocks). *router CPU*: utime + stime of the router "
                "process over the window from /proc, per 1000 requests finished in the window. *others' CPU*: CPU the "
                "machine spent outside the benchmark's processes during the window (other users of this machine)."
            ),
            "",
        ]
        lines += _load_tables(load)
        lines += _latency_table(load.get("latency") or {})
        errs = load.get("engine_errors") or {}
        if errs:
            lines += ["Engine counters over the whole run: " + ", ".join(f"{k} {v:g}" for k, v in errs.items()), ""]
    if store.get("results"):
        lines += [
            "## Conversation store",
            "",
            (
                f"One fresh subprocess per row; entries as `reuse.record` stores them for decode replies with "
                f"{store['blocks']} block ids (32k tokens, block size 16); bytes = RSS growth / conversations."
            ),
            "",
        ]
        lines += _store_table(store)
    history = results.get("history") or []
    if history:
        steps = list(history[0]["steps_us"])
        lines += [
            "## Router work per request vs history length",
            "",
            (
                "The pure-Python steps the router runs for every turn, timed in-process with its own functions "
                "(no HTTP): what long agentic histories add to the CPU per request measured above."
            ),
            "",
            "| history tokens | messages | body KiB | block ids | "
            + " | ".join(f"{s} us" for s in steps)
            + " | total us |",
            "|---:|---:|---:|---:|" + "---:|" * len(steps) + "---:|",
        ]
        for h in history:
            lines.append(
                f"| {h['tokens']:,} | {h['messages']} | {h['body_bytes'] / 1024:.0f} | {h['block_ids']} | "
                + " | ".join(f"{h['steps_us'][s]:,.0f}" for s in steps)
                + f" | {h['total_us']:,.0f} |"
            )
        lines.append("")
    tg = results.get("targets") or []
    if tg:
        lines += ["## Targets", "", "| target | value | result |", "|---|---|---|"]
        lines += [f"| {t['target']} | {t['value']} | {'PASS' if t['pass'] else 'FAIL'} |" for t in tg]
        lines.append("")
    return "\n".join(lines)

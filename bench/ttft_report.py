"""The TTFT benchmark's analysis (derived numbers added to the results), its markdown file and its plot."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import ttft_stats as stats

CONTENDER_NOTES = {
    stats.RECOMPUTE: "no conversation id and a new cache_salt every request: nothing is reused anywhere (prefill "
    "computes the whole prompt; decode reads all of it from prefill)",
    stats.DUPLEX: "the conversation id and one cache_salt per conversation: the router replays decode's blocks, "
    "prefill takes what its own prefix cache holds and reads the rest of the history from decode over NIXL",
    stats.ORACLE: "no conversation id, one cache_salt per conversation, and before each turn (untimed) every prefill "
    "engine computes exactly the previous history with its reply: the timed turn computes only the new suffix",
}


def model_facts(model_dir: Path) -> dict[str, Any]:
    cfg = json.loads((model_dir / "config.json").read_text())
    meta_path = model_dir / "duplex-model.json"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    return {
        "dir": model_dir.name,
        "parameters": meta.get("parameters"),
        "layers": cfg["num_hidden_layers"],
        "hidden": cfg["hidden_size"],
        "kv_heads": cfg["num_key_value_heads"],
        "head_dim": cfg["head_dim"],
        "kv_bytes_per_token": cfg["num_hidden_layers"] * 2 * cfg["num_key_value_heads"] * cfg["head_dim"] * 4,
    }


# -- analysis --------------------------------------------------------------------------------------------------------


def _key(s: dict[str, Any]) -> tuple[Any, ...]:
    return (s["topology"], s["round"], s["conv"], s["turn"])


def placement_split(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """2P1D duplex turns after the first, split by whether prefill was the engine of the conversation's previous
    turn (its prefix cache may hold the history) or the other one (the history comes from decode)."""
    by = {(s["contender"], *_key(s)): s for s in samples}
    groups: dict[str, list[tuple[dict[str, Any], dict[str, Any] | None]]] = {"same": [], "other": []}
    for s in samples:
        if s["topology"] != "2P1D" or s["contender"] != stats.DUPLEX or s["turn"] == 0:
            continue
        prev = by.get((stats.DUPLEX, s["topology"], s["round"], s["conv"], s["turn"] - 1))
        if prev is None or s["prefill_engine"] is None or prev["prefill_engine"] is None:
            continue
        oracle = by.get((stats.ORACLE, *_key(s)))
        groups["same" if s["prefill_engine"] == prev["prefill_engine"] else "other"].append((s, oracle))
    rows = []
    for name, pairs in groups.items():
        if not pairs:
            continue
        over = [d["ttft_s"] / o["ttft_s"] - 1 for d, o in pairs if o and o["ttft_s"] > 0]
        rows.append(
            {
                "prefill": name,
                "turns": len(pairs),
                "prompt_tokens": stats.median([d["prompt_tokens"] for d, _ in pairs]),
                "ttft_p50_s": stats.median([d["ttft_s"] for d, _ in pairs]),
                "external_tokens": stats.median([d["external_tokens"] for d, _ in pairs]),
                "local_tokens": stats.median([d["local_tokens"] for d, _ in pairs]),
                "over_oracle_p50": stats.median(over),
            }
        )
    return rows


def identical_answers(samples: list[dict[str, Any]]) -> dict[str, int]:
    """Greedy replies of the contenders to the same turn: equal unless reuse changed the KV."""
    replies: dict[tuple[Any, ...], set[int]] = {}
    for s in samples:
        replies.setdefault(_key(s), set()).add(s["reply_crc"])
    return {"turns": len(replies), "differing": sum(1 for v in replies.values() if len(v) > 1)}


def cost_model(results: dict[str, Any]) -> dict[str, Any]:
    """The break-even's inputs from this run: prefill seconds per token (recompute prefill legs against their
    prompt length), KV bytes per token and read bandwidth (prefill's NIXL counters), and the fixed cost of a read
    (duplex's prefill leg minus the oracle's on the same turn, 1P1D, where the read is a few blocks)."""
    samples = results["samples"] + results["sweep"]
    out: dict[str, Any] = {}
    rc = [s for s in samples if s["contender"] == stats.RECOMPUTE]
    if len({s["prompt_tokens"] for s in rc}) >= 2:
        a, b = stats.fit_line([s["prompt_tokens"] for s in rc], [s["prefill_leg_s"] for s in rc])
        out["prefill_fit"] = {"intercept_s": a, "s_per_token": b, "tokens_per_s": 1 / b if b > 0 else math.inf}
    reads = [s for s in samples if s["reads"] > 0 and s["external_tokens"] > 0]
    if reads:
        nbytes, tokens, secs = (sum(s[k] for s in reads) for k in ("read_bytes", "external_tokens", "read_s"))
        out["reads"] = {
            "turns": len(reads),
            "bytes_per_token": nbytes / tokens,
            "bandwidth_bytes_per_s": nbytes / secs if secs > 0 else math.inf,
            "nixl_s_per_read_p50": stats.median([s["read_s"] / s["reads"] for s in reads]),
        }
    # The fixed part of a read: a duplex turn that read n tokens, against the oracle's turn (the same prompt, all of
    # it local), less the transfer time at the measured bandwidth.
    by = {(s["contender"], *_key(s)): s for s in results["samples"]}
    bw = out.get("reads", {}).get("bandwidth_bytes_per_s")
    extra = [
        s["prefill_leg_s"] - by[(stats.ORACLE, *_key(s))]["prefill_leg_s"] - s["read_bytes"] / bw
        for s in results["samples"]
        if bw and s["contender"] == stats.DUPLEX and s["reads"] > 0 and (stats.ORACLE, *_key(s)) in by
    ]
    if extra:
        out["read_latency_s"] = stats.median(extra)
        out["read_latency_turns"] = len(extra)
    fit, rd = out.get("prefill_fit"), out.get("reads")
    if fit and rd and "read_latency_s" in out:
        out["break_even_tokens"] = stats.break_even_tokens(
            fit["s_per_token"], rd["bytes_per_token"], rd["bandwidth_bytes_per_s"], max(out["read_latency_s"], 0.0)
        )
    return out


def sweep_rows(sweep: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per threshold and turn: the prompt, what duplex's prefill read, its TTFT and the recompute reference's."""
    rows = []
    for threshold in sorted({s["threshold"] for s in sweep}):
        for turn in sorted({s["turn"] for s in sweep if s["threshold"] == threshold}):
            cell = [s for s in sweep if s["threshold"] == threshold and s["turn"] == turn]
            dx = [s for s in cell if s["contender"] == stats.DUPLEX]
            rc = [s for s in cell if s["contender"] == stats.RECOMPUTE]
            if not dx or not rc:
                continue
            rows.append(
                {
                    "threshold": threshold,
                    "turn": turn,
                    "prompt_tokens": stats.median([s["prompt_tokens"] for s in dx]),
                    "read_tokens": stats.median([s["external_tokens"] for s in dx]),
                    "duplex_ttft_s": stats.median([s["ttft_s"] for s in dx]),
                    "recompute_ttft_s": stats.median([s["ttft_s"] for s in rc]),
                    "duplex_prefill_s": stats.median([s["prefill_leg_s"] for s in dx]),
                    "recompute_prefill_s": stats.median([s["prefill_leg_s"] for s in rc]),
                }
            )
    return rows


def analyse(results: dict[str, Any]) -> None:
    samples = results["samples"]
    results["by_turn"] = stats.table(samples, "turn")
    results["by_bucket"] = stats.table(samples, "bucket")
    results["targets"] = stats.targets(results["by_bucket"])
    results["placement_2p1d"] = placement_split(samples)
    results["answers"] = identical_answers(samples)
    results["sweep_rows"] = sweep_rows(results["sweep"])
    results["cost_model"] = cost_model(results)
    gaps = [s["gap_s"] for s in samples if s["contender"] == stats.DUPLEX and s["gap_s"] is not None]
    results["inter_turn_gap_s"] = {"p50": stats.median(gaps), "max": max(gaps) if gaps else math.nan}


# -- markdown --------------------------------------------------------------------------------------------------------


def _f(v: Any, fmt: str = "{:.2f}") -> str:
    if v is None or (isinstance(v, float) and (math.isnan(v) or math.isinf(v))):
        return "-" if v is None or math.isnan(v) else "inf"
    return fmt.format(v)


def _contender_cells(row: dict[str, Any]) -> list[str]:
    out = []
    for c in stats.CONTENDERS:
        cell = row["cells"].get(c)
        out.append(f"{_f(cell['ttft_p50_s'])} / {_f(cell['ttft_p99_s'])}" if cell else "-")
    return out


def _table(rows: list[dict[str, Any]], by: str, topology: str) -> list[str]:
    head = "turn" if by == "turn" else "history"
    lines = [
        f"| {head} | prompt tokens | recompute p50 / p99 s | duplex p50 / p99 s | oracle p50 / p99 s | duplex speed-up "
        "vs recompute | duplex over oracle | duplex tokens read back (local hits) | samples |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        if r["topology"] != topology:
            continue
        dx = r["cells"].get(stats.DUPLEX, {})
        tokens = dx.get("prompt_tokens", next(iter(r["cells"].values()))["prompt_tokens"])
        n = sum(int(c["n"]) for c in r["cells"].values())
        label = r[by] + 1 if by == "turn" else r[by]
        lines.append(
            f"| {label} | {_f(tokens, '{:.0f}')} | "
            + " | ".join(_contender_cells(r))
            + f" | {_f(r['speedup_vs_recompute'])}x | {_f(r['over_oracle'], '{:+.1%}')} | "
            f"{_f(dx.get('external_tokens'), '{:.0f}')} ({_f(dx.get('local_tokens'), '{:.0f}')}) | {n} |"
        )
    return lines


def markdown(results: dict[str, Any]) -> str:
    m = results["machine"]
    out = [
        "# TTFT benchmark: recompute, duplex, oracle on real vLLM CPU engines",
        "",
        f"- command: `{results['command']}`" + ("" if results["complete"] else " (**incomplete run**)"),
        f"- commit: `{m.get('git_commit')}`" + (" (sidecars/ modified)" if m.get("sidecars_dirty") else ""),
        f"- machine: {m['nproc']} CPUs ({m['cpu_model']}), {m['mem_total_gib']} GiB, kernel {m['kernel']}, "
        f"Python {m['python']}",
        f"- started {results['started']}, finished {results.get('finished')}, wall {results.get('wall_s', 0):.0f} s, "
        f"load average before {results['load_before'][0]:.1f}, after {results.get('load_after', [math.nan])[0]:.1f}",
        f"- model: `{results['preset']}` preset ({results.get('model', {}).get('parameters') or '?'} parameters, "
        f"{results.get('model', {}).get('kv_bytes_per_token', '?')} KV bytes per token), float32, block 32",
        f"- workload: seed {results['seed']}, {results['conversations']} conversations at once, "
        f"{results['shape']['turns']} turns, {results['rounds']} rounds; decode block TTL {results['block_ttl_s']:.0f} s; "
        f"inter-turn gap p50 {_f(results['inter_turn_gap_s']['p50'], '{:.0f}')} s, "
        f"max {_f(results['inter_turn_gap_s']['max'], '{:.0f}')} s",
        f"- greedy answers: {results['answers']['differing']} of {results['answers']['turns']} turns differ between "
        "contenders",
        "",
        "Contenders (same engines, interleaved turn by turn, order rotated):",
        "",
        *[f"- `{c}`: {CONTENDER_NOTES[c]}" for c in stats.CONTENDERS],
        "",
        "TTFT = the client's wall time of the (non-streamed) turn minus decode's time after its first token "
        "(vllm:e2e_request_latency_seconds - vllm:time_to_first_token_seconds on decode). Tokens read back: prefill's "
        "vllm:prompt_tokens_by_source_total{source=external_kv_transfer}, median per turn.",
        "",
    ]
    if results.get("plot"):
        out += [f"![TTFT against history length]({results['plot']})", ""]
    for topology in sorted({r["topology"] for r in results["by_turn"]}):
        out += [f"## {topology}", "", "### Per turn", "", *_table(results["by_turn"], "turn", topology), ""]
        out += ["### Per history length", "", *_table(results["by_bucket"], "bucket", topology), ""]
        if topology == "2P1D" and results["placement_2p1d"]:
            out += [
                "### 2P1D duplex turns by placement",
                "",
                "| prefill engine | turns | prompt tokens | TTFT p50 s | tokens read back | local hits | over oracle p50 |",
                "|---|---:|---:|---:|---:|---:|---:|",
            ]
            for r in results["placement_2p1d"]:
                out.append(
                    f"| {'same as previous turn' if r['prefill'] == 'same' else 'the other one'} | {r['turns']} | "
                    f"{r['prompt_tokens']:.0f} | {r['ttft_p50_s']:.2f} | {r['external_tokens']:.0f} | "
                    f"{r['local_tokens']:.0f} | {_f(r['over_oracle_p50'], '{:+.1%}')} |"
                )
            out.append("")
    if results["targets"]:
        out += ["## Targets", "", "| topology | target | measured | met |", "|---|---|---|---|"]
        for t in results["targets"]:
            out.append(f"| {t['topology']} | {t['target']} | {t['value']} | {'yes' if t['pass'] else 'no'} |")
        out.append("")
    if results["sweep_rows"]:
        out += [
            "## kv_recompute_threshold sweep (1P1D, prefill prefix caching off)",
            "",
            "| threshold | turn | prompt tokens | duplex read back | duplex TTFT s | recompute TTFT s | duplex prefill leg s "
            "| recompute prefill leg s |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in results["sweep_rows"]:
            out.append(
                f"| {r['threshold']} | {r['turn'] + 1} | {r['prompt_tokens']:.0f} | {r['read_tokens']:.0f} | "
                f"{r['duplex_ttft_s']:.3f} | {r['recompute_ttft_s']:.3f} | {r['duplex_prefill_s']:.3f} | "
                f"{r['recompute_prefill_s']:.3f} |"
            )
        out.append("")
    cm = results["cost_model"]
    if cm:
        out += ["## Cost model fitted to this run", ""]
        if "prefill_fit" in cm:
            f = cm["prefill_fit"]
            out.append(
                f"- prefill (recompute legs): {f['intercept_s'] * 1000:.0f} ms + {f['s_per_token'] * 1000:.3f} ms "
                f"per prompt token ({f['tokens_per_s']:.0f} tokens/s)"
            )
        if "reads" in cm:
            r = cm["reads"]
            out.append(
                f"- D->P reads: {r['bytes_per_token']:.0f} bytes per token, {r['bandwidth_bytes_per_s'] / 1e9:.2f} GB/s "
                f"(NIXL transfer time), NIXL time per read p50 {r['nixl_s_per_read_p50'] * 1000:.1f} ms, "
                f"{r['turns']} turns with reads"
            )
        if "read_latency_s" in cm:
            out.append(
                f"- fixed cost of a read (duplex prefill leg that read - the oracle's on the same turn - transfer time, "
                f"median of {cm['read_latency_turns']} turns): {cm['read_latency_s'] * 1000:.0f} ms"
            )
        if "break_even_tokens" in cm:
            out.append(f"- break-even: reads beat recompute above {_f(cm['break_even_tokens'], '{:.0f}')} tokens")
        out.append("")
    return "\n".join(out)


# -- plot ------------------------------------------------------------------------------------------------------------


def can_plot() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


COLOURS = {stats.RECOMPUTE: "tab:red", stats.DUPLEX: "tab:blue", stats.ORACLE: "tab:green"}


def plot(results: dict[str, Any], path: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    topologies = sorted({s["topology"] for s in results["samples"]})
    fig, axes = plt.subplots(1, len(topologies), figsize=(6 * len(topologies), 4.2), squeeze=False, sharey=True)
    for ax, topology in zip(axes[0], topologies, strict=True):
        for c in stats.CONTENDERS:
            pts = [s for s in results["samples"] if s["topology"] == topology and s["contender"] == c]
            if not pts:
                continue
            ax.scatter(
                [s["prompt_tokens"] for s in pts], [s["ttft_s"] for s in pts], s=12, alpha=0.45, color=COLOURS[c]
            )
            turns = sorted({s["turn"] for s in pts})
            xs = [stats.median([s["prompt_tokens"] for s in pts if s["turn"] == t]) for t in turns]
            ys = [stats.median([s["ttft_s"] for s in pts if s["turn"] == t]) for t in turns]
            ax.plot(xs, ys, marker="o", color=COLOURS[c], label=f"{c} (median per turn)")
        ax.set_title(f"{topology}: TTFT against history length")
        ax.set_xlabel("prompt tokens")
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left", fontsize=8)
    axes[0][0].set_ylabel("TTFT, s")
    fig.suptitle(f"real vLLM CPU engines, {results['preset']} model ({results['started'][:10]})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

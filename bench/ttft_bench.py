"""Multi-turn TTFT on real vLLM CPU engines through the real `duplex router`: recompute, duplex's bidirectional
reuse and the oracle, in 1P1D and 2P1D, plus a kv_recompute_threshold sweep.

    python bench/ttft_bench.py            # the full run (~45 min on 2 shared cores); bench/results/ttft-<date>.{md,json,png}
    python bench/ttft_bench.py --quick    # 2 conversations x 3 turns, the test model (< 3 min); results go to
                                          # bench/results/tmp/ttft-<date>-quick.* (ignored by git)

See docs/benchmarks.md ("TTFT benchmark") for what each contender is and how to read the numbers.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shlex
import signal
import sys
import time
import zlib
from typing import Any

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
sys.path.insert(0, BENCH)

import procstat
import results_io
import ttft_report
import ttft_rig as rig
import ttft_stats as stats
import ttft_workload as workload

from duplex_dev.launch.vllm import VllmEngine, calm_spinners, start_all

_T0 = time.monotonic()


def say(msg: str) -> None:
    print(f"[{time.monotonic() - _T0:7.1f}s] {msg}", flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="2 conversations x 3 turns, tiny histories, the test model")
    p.add_argument("--seed", type=int, default=11, help="workload seed (default 11)")
    p.add_argument("--conversations", type=int, help="conversations alive at once (default 3; quick 2)")
    p.add_argument("--turns", type=int, help="turns per conversation (default 8; quick 3)")
    p.add_argument("--rounds", type=int, help="rounds per topology (default 2; quick 1)")
    p.add_argument("--topologies", default="1P1D,2P1D", help="1P1D and/or 2P1D")
    p.add_argument(
        "--sweep-threshold",
        help="kv_recompute_threshold values for the sweep, comma-separated (default 0,64,256,1024; quick: none; "
        "empty: no sweep)",
    )
    p.add_argument("--sweep-turns", type=int, help="turns per conversation in the sweep (default 5; quick 3)")
    p.add_argument("--sweep-conversations", type=int, default=2, help="conversations in the sweep (default 2)")
    p.add_argument(
        "--block-ttl", type=float, default=480.0, help="decode's decoder_kv_blocks_ttl, seconds (default 480, vLLM's)"
    )
    p.add_argument(
        "--kv-gib",
        help="KV cache GiB (whole: vLLM reads an int) per prefill and for decode, as PREFILL,DECODE (default 1,6; quick 1,1)",
    )
    p.add_argument("--out", help="results stem (default bench/results/ttft-<date>[-quick])")
    args = p.parse_args(argv)
    q = args.quick
    args.preset = "test" if q else "bench"
    args.conversations = args.conversations or (2 if q else 3)
    args.rounds = args.rounds or (1 if q else 2)
    base = workload.QUICK if q else workload.FULL
    args.shape = workload.Shape(**{**base.__dict__, "turns": args.turns or base.turns})
    sweep_base = workload.QUICK if q else workload.SWEEP
    args.sweep_shape = workload.Shape(**{**sweep_base.__dict__, "turns": args.sweep_turns or sweep_base.turns})
    raw = args.sweep_threshold if args.sweep_threshold is not None else ("" if q else "0,64,256,1024")
    args.thresholds = [int(x) for x in raw.split(",") if x.strip()]
    # KV budgets (GiB): decode keeps every finished turn for the block TTL; the bench model's KV is 16 KiB a token.
    prefill_gib, decode_gib = (int(x) for x in (args.kv_gib or ("1,1" if q else "1,6")).split(","))
    args.kv_gib = {"prefill": prefill_gib, "decode": decode_gib}
    return args


def run_conversations(
    label: str,
    prefills: list[VllmEngine],
    decode: VllmEngine,
    router: Any,
    args: argparse.Namespace,
    shape: workload.Shape,
    contenders: tuple[str, ...],
    tag: str,
    extra: dict[str, Any],
    samples: list[dict[str, Any]],
) -> None:
    """Appends to `samples`, as it goes (a failed run keeps what it measured). Every round: the contenders' own copies of the same conversations, turn by turn, contenders interleaved per
    turn (the order rotates), each contender's conversations one after the other (so several are alive at once)."""
    sweep = "threshold" in extra
    calmed: set[int] = set()
    for rnd in range(1 if sweep else args.rounds):
        count = args.sweep_conversations if sweep else args.conversations
        convs = {c: workload.conversations(args.seed, count, shape) for c in contenders}
        last_end: dict[tuple[str, str], float] = {}
        for turn in range(shape.turns):
            started = time.monotonic()
            for contender in stats.rotation(contenders, turn + rnd):
                for conv in convs[contender]:
                    key = f"{tag}-{label}-r{rnd}-{contender}-{conv.name}"
                    salt = f"{key}-t{turn}" if contender == stats.RECOMPUTE else key
                    plan = conv.plans[turn]
                    body = rig.chat_body(
                        conv.request(turn), plan.max_tokens, workload.TOOLS, workload.TOOL_CHOICE, salt
                    )
                    if contender == stats.ORACLE:
                        rig.warm(prefills, body, conv.prefix(turn))
                    calm_spinners([*prefills, decode], calmed)
                    gap = time.monotonic() - last_end[(contender, conv.name)] if turn else None
                    sample, text = rig.measure(
                        prefills, decode, router, body, key if contender == stats.DUPLEX else None
                    )
                    last_end[(contender, conv.name)] = time.monotonic()
                    conv.record_reply(turn, text)
                    samples.append(
                        {
                            "topology": label,
                            "contender": contender,
                            "round": rnd,
                            "conv": conv.name,
                            "turn": turn,
                            "gap_s": gap,
                            "reply_crc": zlib.crc32(text.encode()),
                            **extra,
                            **sample,
                        }
                    )
            done = [s for s in samples if s["topology"] == label and s["turn"] == turn and s["round"] == rnd]
            line = ", ".join(
                f"{c} {stats.median([s['ttft_s'] for s in done if s['contender'] == c]):.2f}s" for c in contenders
            )
            tokens = stats.median([s["prompt_tokens"] for s in done])
            say(
                f"{label} round {rnd + 1} turn {turn + 1}/{shape.turns}: ~{tokens:.0f} prompt tokens; "
                f"TTFT p50 {line} ({time.monotonic() - started:.0f} s)"
            )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the engines and write what was measured
    command = " ".join(["python", "bench/ttft_bench.py", *map(shlex.quote, argv if argv is not None else sys.argv[1:])])
    date = dt.date.today().isoformat()
    # A quick run goes beside, not into, the committed results (a top-level one would retire the full run's files).
    where = os.path.join(results_io.RESULTS, "tmp") if args.quick else results_io.RESULTS
    stem = args.out or os.path.join(where, f"ttft-{date}{'-quick' if args.quick else ''}")
    tag = f"{int(time.time())}"
    results: dict[str, Any] = {
        "command": command,
        "machine": procstat.machine_facts(ROOT),
        "started": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "load_before": os.getloadavg(),
        "preset": args.preset,
        "seed": args.seed,
        "conversations": args.conversations,
        "rounds": args.rounds,
        "shape": args.shape.__dict__,
        "sweep_shape": args.sweep_shape.__dict__,
        "sweep_conversations": args.sweep_conversations,
        "block_ttl_s": args.block_ttl,
        "kv_gib": args.kv_gib,
        "samples": [],
        "sweep": [],
        "complete": False,
    }
    topologies = [t.strip() for t in args.topologies.split(",") if t.strip()]
    need_second = "2P1D" in topologies
    # Core plan: decode on CPU 1, every prefill on CPU 0 (in 2P1D only one computes at a time: turns are sequential).
    decode = rig.engine(
        "decode", args.preset, args.kv_gib["decode"], "1", kv_extra={"decoder_kv_blocks_ttl": int(args.block_ttl)}
    )
    prefills = [rig.engine("prefill", args.preset, args.kv_gib["prefill"], "0") for _ in range(2 if need_second else 1)]
    engines = [*prefills, decode]
    try:
        say(f"starting {len(engines)} engines ({args.preset} model), one OpenMP thread each")
        start_all(engines)
        say("engines healthy")
        results["engine_changes"] = {e.role + str(i): [str(c) for c in e.changes] for i, e in enumerate(engines)}
        results["model"] = ttft_report.model_facts(decode.model_dir)
        for label in topologies:
            use = prefills[:1] if label == "1P1D" else prefills[:2]
            router = rig.start_router(use, decode, "least_outstanding", args.block_ttl)
            try:
                run_conversations(
                    label, use, decode, router, args, args.shape, stats.CONTENDERS, tag, {}, results["samples"]
                )
            finally:
                router.stop()
        for p in prefills:
            p.stop()
        for threshold in args.thresholds:
            say(f"sweep: prefill with kv_recompute_threshold {threshold}, prefix caching off")
            p = rig.engine(
                "prefill",
                args.preset,
                args.kv_gib["prefill"],
                "0",
                prefix_caching=False,
                kv_extra={"kv_recompute_threshold": threshold},
            )
            start_all([p])
            router = rig.start_router([p], decode, "least_outstanding", args.block_ttl)
            try:
                run_conversations(
                    f"T{threshold}",
                    [p],
                    decode,
                    router,
                    args,
                    args.sweep_shape,
                    (stats.RECOMPUTE, stats.DUPLEX),
                    tag,
                    {"threshold": threshold},
                    results["sweep"],
                )
            finally:
                router.stop()
                p.stop()
        results["complete"] = True
    finally:
        for e in engines:
            e.stop()
        results["finished"] = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
        results["load_after"] = os.getloadavg()
        results["wall_s"] = time.monotonic() - _T0
        if results["samples"] or results["sweep"]:
            ttft_report.analyse(results)
            results["plot"] = os.path.basename(stem) + ".png" if ttft_report.can_plot() else None
            results_io.write(stem, results, ttft_report.markdown(results))  # moves earlier runs' files away first
            if results["plot"]:
                ttft_report.plot(results, stem + ".png")
            say(f"wrote {stem}.md, .json{', .png' if results['plot'] else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Fit the simulator's cost model to a TTFT benchmark on real vLLM engines: bench/results/sim-cost.{json,md}.

    .venv/bin/python bench/sim_cost_fit.py                      # from bench/results/ttft-*.json (the latest)
    .venv/bin/python bench/sim_cost_fit.py --ttft FILE --out STEM

Every prefill leg of the run is one sample: the tokens prefill computed, the context they attended to (its local hits
and what it read), whether it read decode's blocks back, and its seconds. Least squares, every coefficient at least 0:

    seconds = compute * computed + attention * pairs + read_back * [read decode's blocks] + read bytes / bandwidth

with `pairs` what the simulator charges attention for (cost.py), the bandwidth from prefill's own NIXL counters, and
decode's seconds per generated token from the turns' wall time after their first token. The `cost` object it writes
is what `duplex sim --cost-profile` reads. It also replays every measured turn through the fitted model, to say how
far the model is from each kind of turn, and lists the turns where reuse was slower than recomputing, with why.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "sidecars"))

import ttft_stats as stats

from duplex_sidecars.sim.cost import CostModel

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
COLUMNS = ("compute", "attention", "read_back")


def latest_ttft() -> str:
    runs = sorted(glob.glob(os.path.join(RESULTS, "ttft-*.json")))
    if not runs:
        raise SystemExit("sim_cost_fit: no bench/results/ttft-*.json: run `make bench-ttft` first, or pass --ttft")
    return runs[-1]


def pairs(computed: float, context: float) -> float:
    return computed * context + computed * (computed + 1) / 2


def legs(results: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for s in results["samples"] + results.get("sweep", []) if s.get("prefill_leg_s")]


def reads(samples: list[dict[str, Any]]) -> tuple[float, float]:
    """Bytes per second and bytes per token of prefill's reads, from its NIXL counters."""
    done = [s for s in samples if s["reads"] > 0 and s["read_s"] > 0 and s["external_tokens"] > 0]
    if not done:
        raise SystemExit("sim_cost_fit: no turn of this run read decode's blocks back: nothing to fit a read to")
    nbytes = sum(s["read_bytes"] for s in done)
    return nbytes / sum(s["read_s"] for s in done), nbytes / sum(s["external_tokens"] for s in done)


def features(s: dict[str, Any]) -> list[float]:
    context = s["local_tokens"] + s["external_tokens"]
    return [s["computed_tokens"], pairs(s["computed_tokens"], context), 1.0 if s["reads"] > 0 else 0.0]


def nonnegative_fit(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with every coefficient >= 0: a column whose coefficient comes out negative is dropped (set to
    0) and the rest fitted again. Enough for three columns."""
    keep = list(range(x.shape[1]))
    while keep:
        coef = np.linalg.lstsq(x[:, keep], y, rcond=None)[0]
        if (coef >= 0).all():
            out = np.zeros(x.shape[1])
            out[keep] = coef
            return out
        keep.pop(int(np.argmin(coef)))
    return np.zeros(x.shape[1])


def decode_s_per_token(samples: list[dict[str, Any]]) -> float:
    per = [(s["wall_s"] - s["ttft_s"]) / (s["completion_tokens"] - 1) for s in samples if s["completion_tokens"] > 1]
    return stats.median(per)


def fit(results: dict[str, Any]) -> dict[str, Any]:
    samples = legs(results)
    bw, bytes_per_token = reads(samples)
    x = np.array([features(s) for s in samples])
    y = np.array([s["prefill_leg_s"] - s["read_bytes"] / bw for s in samples])
    coef = nonnegative_fit(x, y)
    cost = CostModel(
        prefill_us_per_token=float(coef[0] * 1e6),
        prefill_attention_us_per_token2=float(coef[1] * 1e6),
        decode_us_per_token=float(decode_s_per_token(samples) * 1e6),
        transfer_gbps=float(bw * 8 / 1e9),
        read_back_latency_us=float(coef[2] * 1e6),
    )
    return {"cost": cost, "samples": samples, "bandwidth": bw, "bytes_per_token": bytes_per_token}


def predicted_leg(cost: CostModel, s: dict[str, Any]) -> float:
    context = s["local_tokens"] + s["external_tokens"]
    read = cost.read_seconds(int(s["read_bytes"]), read_back=True) if s["reads"] > 0 else 0.0
    return cost.prefill_seconds(int(s["computed_tokens"]), int(context)) + read


def errors(cost: CostModel, samples: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Median and p90 of |predicted - measured| / measured prefill leg, per kind of turn."""
    kinds: dict[str, list[float]] = {}
    for s in samples:
        kind = s["contender"] + (" (read back)" if s["reads"] > 0 else "")
        err = abs(predicted_leg(cost, s) - s["prefill_leg_s"]) / s["prefill_leg_s"]
        kinds.setdefault(kind, []).append(err)
        kinds.setdefault("all", []).append(err)
    return {k: {"turns": len(v), "median": stats.median(v), "p90": stats.percentile(v, 90)} for k, v in kinds.items()}


def _key(s: dict[str, Any]) -> tuple[Any, ...]:
    return s.get("threshold"), s["topology"], s["round"], s["conv"], s["turn"]


def slower_turns(cost: CostModel, results: dict[str, Any]) -> list[dict[str, Any]]:
    """Replayed duplex turns whose TTFT was above recompute's on the same turn, and what the model says of them."""
    samples = results["samples"] + results.get("sweep", [])
    recompute = {_key(s): s for s in samples if s["contender"] == stats.RECOMPUTE}
    out = []
    for s in samples:
        ref = recompute.get(_key(s))
        if s["contender"] != stats.DUPLEX or not s["replayed"] or ref is None or s["ttft_s"] <= ref["ttft_s"]:
            continue
        saved = ref["computed_tokens"] - s["computed_tokens"]
        model_gain = predicted_leg(cost, ref) - predicted_leg(cost, s)
        if s["reads"] == 0 and saved <= 0:
            why = "nothing was reused: the remote part fell under the threshold and prefill's own cache held nothing"
        elif model_gain > 0:
            why = (f"the model expects reuse to save {model_gain:.2f} s here; the measured difference "
                   f"({s['ttft_s'] - ref['ttft_s']:+.2f} s) is the machine's noise")  # fmt: skip
        else:
            why = f"a read of {s['external_tokens']:.0f} tokens costs more than recomputing them"
        out.append({"topology": s["topology"], "threshold": s.get("threshold"), "conv": s["conv"], "turn": s["turn"],
                    "prompt_tokens": s["prompt_tokens"], "ttft_s": s["ttft_s"], "recompute_ttft_s": ref["ttft_s"],
                    "tokens_saved": saved, "tokens_read": s["external_tokens"], "model_gain_s": model_gain,
                    "why": why})  # fmt: skip
    return out


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return "unknown"


def markdown(doc: dict[str, Any]) -> str:
    c = doc["cost"]
    lines = [
        "# The simulator's cost model, fitted to real vLLM CPU engines",
        "",
        f"`{doc['command']}` on commit {doc['commit']}, from `{doc['source']}` ({doc['legs']} prefill legs).",
        "",
        "| field | value |",
        "|---|---:|",
        *(f"| `{k}` | {v:.4g} |" for k, v in c.items()),
        "",
        f"Break-even of a read back at 1k tokens of context: {doc['break_even_tokens_at_1k']:.0f} tokens.",
        "",
        "How far the fitted model is from each kind of prefill leg (|predicted - measured| / measured):",
        "",
        "| turns | count | median | p90 |",
        "|---|---:|---:|---:|",
        *(f"| {k} | {v['turns']} | {v['median']:.0%} | {v['p90']:.0%} |" for k, v in sorted(doc["errors"].items())),
        "",
        f"Replayed turns slower than recompute on the same turn: {len(doc['slower_turns'])}.",
        "",
    ]
    for t in doc["slower_turns"]:
        lines.append(f"- {t['topology']} {t['conv']} turn {t['turn']} ({t['prompt_tokens']} tokens): "
                     f"{t['ttft_s']:.2f} s against {t['recompute_ttft_s']:.2f} s; {t['why']}")  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ttft", help="a TTFT benchmark's results JSON (default: the latest bench/results/ttft-*.json)")
    ap.add_argument("--out", default=os.path.join(RESULTS, "sim-cost"), help="output stem (.json and .md)")
    args = ap.parse_args(argv)
    source = args.ttft or latest_ttft()
    with open(source) as f:
        results = json.load(f)
    fitted = fit(results)
    cost: CostModel = fitted["cost"]
    per_token_at_1k = cost.prefill_seconds(1, 1000)
    doc = {
        "command": " ".join(["python", "bench/sim_cost_fit.py", *(argv if argv is not None else sys.argv[1:])]),
        "commit": _commit(),
        "source": os.path.relpath(source, os.path.dirname(os.path.dirname(RESULTS))),
        "machine": results.get("machine"),
        "legs": len(fitted["samples"]),
        "cost": {k: round(v, 6) for k, v in vars(cost).items()},
        "bytes_per_token": fitted["bytes_per_token"],
        "break_even_tokens_at_1k": stats.break_even_tokens(
            per_token_at_1k, fitted["bytes_per_token"], fitted["bandwidth"], cost.read_back_latency_us / 1e6
        ),
        "errors": errors(cost, fitted["samples"]),
        "slower_turns": slower_turns(cost, results),
    }
    with open(args.out + ".json", "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    with open(args.out + ".md", "w") as f:
        f.write(markdown(doc))
    print(markdown(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())

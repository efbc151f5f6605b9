"""The TTFT benchmark's pure parts: the workload generator and the statistics (no engine: bench/ttft_bench.py runs
the real ones)."""

from __future__ import annotations

import itertools
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))

import ttft_stats as stats
import ttft_workload as workload


def test_same_seed_same_conversations_and_others_differ():
    a = workload.conversations(11, 3)
    b = workload.conversations(11, 3)
    assert [c.plans for c in a] == [c.plans for c in b]
    assert a[0].plans != a[1].plans
    assert workload.conversation(12, 0).plans != a[0].plans


def test_histories_grow_every_turn_past_the_long_history_mark():
    for conv in workload.conversations(11, 3):
        grown = workload.planned_words(conv)
        assert len(grown) == workload.FULL.turns >= 8
        assert all(later > earlier for earlier, later in itertools.pairwise(grown))
        assert grown[-1] > 1800  # words: ~2 tokens each with the bench tokenizer, plus the tools list and replies
    assert workload.planned_words(workload.conversation(11, 0, workload.QUICK))[-1] < 400


def test_turns_are_agentic_a_tool_call_then_its_output():
    conv = workload.conversation(11, 0)
    assert [m["role"] for m in conv.plans[0].new_messages] == ["system", "user"]
    for plan in conv.plans[1:]:
        call, output, *rest = plan.new_messages
        assert call["role"] == "assistant" and call["tool_calls"][0]["id"] == output["tool_call_id"]
        assert output["role"] == "tool"
        assert [m["role"] for m in rest] in ([], ["user"])
        lo, hi = workload.FULL.reply_tokens
        assert lo <= plan.max_tokens <= hi


def test_each_request_starts_with_the_previous_one_and_its_reply():
    conv = workload.conversation(11, 0, workload.QUICK)
    assert conv.prefix(0) == []
    first = conv.request(0)
    conv.record_reply(0, " one two")
    assert conv.prefix(1) == [*first, {"role": "assistant", "content": " one two"}]
    assert conv.request(1)[: len(conv.prefix(1))] == conv.prefix(1)
    with pytest.raises(ValueError):
        conv.request(0)


def test_percentiles_interpolate_between_ranks():
    assert stats.median([3.0, 1.0, 2.0]) == 2.0
    assert stats.percentile([1.0, 2.0], 99) == pytest.approx(1.99)
    assert math.isnan(stats.median([]))


def test_rotation_gives_every_contender_every_position():
    orders = [stats.rotation(stats.CONTENDERS, k) for k in range(3)]
    assert {tuple(o) for o in orders} == {
        ("recompute", "duplex", "oracle"),
        ("duplex", "oracle", "recompute"),
        ("oracle", "recompute", "duplex"),
    }


def _sample(contender: str, tokens: int, ttft: float, turn: int = 0, topology: str = "1P1D") -> dict:
    return {
        "topology": topology,
        "contender": contender,
        "turn": turn,
        "prompt_tokens": tokens,
        "ttft_s": ttft,
        "prefill_leg_s": ttft,
        "external_tokens": 0,
        "local_tokens": 0,
    }


def test_ratios_and_buckets_and_targets():
    samples = [
        _sample("recompute", 4500, 8.0, 7),
        _sample("recompute", 4600, 10.0, 7),
        _sample("duplex", 4500, 1.1, 7),
        _sample("duplex", 4600, 1.1, 7),
        _sample("oracle", 4500, 1.0, 7),
        _sample("oracle", 4600, 1.0, 7),
        _sample("recompute", 2500, 4.0, 4),
        _sample("duplex", 2500, 2.0, 4),
        _sample("oracle", 2500, 1.0, 4),
        _sample("recompute", 500, 1.0, 0),
        _sample("duplex", 500, 1.0, 0),
        _sample("oracle", 500, 1.0, 0),
    ]
    rows = stats.table(samples, "bucket")
    assert [r["bucket"] for r in rows] == ["0k-1k", "2k-4k", ">= 4k"]
    longest = rows[-1]
    assert longest["speedup_vs_recompute"] == pytest.approx(9.0 / 1.1)
    assert longest["over_oracle"] == pytest.approx(0.1)
    assert longest["cells"]["recompute"]["ttft_p99_s"] == pytest.approx(9.98)
    targets = stats.targets(rows)
    within, speedup = targets
    assert not within["pass"] and within["worst"] == pytest.approx(1.0)  # 2k-4k: duplex twice the oracle
    assert speedup["pass"]
    by_turn = stats.table(samples, "turn")
    assert [r["turn"] for r in by_turn] == [0, 4, 7]


def test_break_even_formula():
    # 1 ms a token to compute, 16 KiB a token at 1.6384 GB/s (0.01 ms), 9.9 ms per read: 10 tokens.
    assert stats.break_even_tokens(1e-3, 16384, 1.6384e9, 9.9e-3) == pytest.approx(10.0)
    assert stats.break_even_tokens(1e-6, 16384, 1e9, 1e-3) == math.inf  # the wire is slower than compute


def test_fit_line():
    assert stats.fit_line([0, 1000, 2000], [0.1, 1.1, 2.1]) == pytest.approx((0.1, 0.001))
    with pytest.raises(ValueError):
        stats.fit_line([1, 1], [1, 2])

"""bench/placement_bench.py's pure parts: every policy of a (size, round) gets the same conversations, think times and
start offsets; the summary pools rounds per read cost, size and policy; a target is met only when `cost` is below."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))

import placement_bench as bench
import pytest

from duplex_sidecars.sim.cost import CostModel


def test_every_policy_of_a_round_gets_the_same_plan_and_rounds_differ():
    args = bench.parse_args(["--quick"])
    first, again, other = bench.plan(args, 4, 0), bench.plan(args, 4, 0), bench.plan(args, 4, 1)
    assert [c.plans[1].new_messages for c in first[0]] == [c.plans[1].new_messages for c in again[0]]
    assert first[1:] == again[1:]
    assert first[1:] != other[1:]
    assert all(args.think[0] <= t <= args.think[1] for ts in first[1] for t in ts)


def _run(policy, size, ttfts, read_ms=98.0, rnd=0):
    turns = [{"turn": i, "ttft_s": t} for i, t in enumerate(ttfts)]
    tokens = {"local_compute": 10.0, "local_cache_hit": 5.0, "external_kv_transfer": 1.0}
    return {"read_ms": read_ms, "policy": policy, "size": size, "round": rnd, "hits": len(ttfts) - 1,
            "tokens": tokens, "turns": turns}  # fmt: skip


def test_rounds_pool_and_the_first_turn_is_left_out_of_follow_ups():
    runs = [_run("cost", 8, [9.0, 1.0, 2.0]), _run("cost", 8, [9.0, 3.0, 4.0], rnd=1),
            _run("least_outstanding", 8, [9.0, 2.0, 2.0])]  # fmt: skip
    rows = {r["policy"]: r for r in bench.summarise(runs)}
    assert rows["cost"]["follow_ups"] == 4 and rows["cost"]["runs"] == 2
    assert rows["cost"]["p50"] == 2.5 and rows["cost"]["p50_all"] == 3.5
    assert rows["cost"]["local_compute"] == 20.0


def test_a_target_is_met_only_below_the_other_policy():
    rows = bench.summarise([_run("cost", 8, [0.0, 2.0]), _run("round_robin", 8, [0.0, 2.0]),
                            _run("least_outstanding", 8, [0.0, 3.0])])  # fmt: skip
    met = {(t["against"], t["quantile"]): t["met"] for t in bench.targets(rows)}
    assert met == {("round_robin", "p50"): False, ("round_robin", "p99"): False,
                   ("least_outstanding", "p50"): True, ("least_outstanding", "p99"): True}  # fmt: skip


def test_cost_placement_starts_from_the_profile_at_the_run_s_time_scale():
    args = bench.parse_args(["--quick", "--time-scale", "0.5"])
    cost = CostModel(prefill_us_per_token=3000, read_back_latency_us=100_000, transfer_gbps=8)
    placement = bench.router_config("cost", cost, args)["placement"]
    assert placement["prefill"] == "cost"
    assert placement["read_latency_ms"] == 50.0 and placement["compute_ms_per_1k_tokens"] == 1500.0


def test_read_back_variants_name_the_profile_s_own_or_milliseconds():
    assert bench.parse_args([]).read_back_latency_ms == [None]  # the profile's own
    assert bench.parse_args(["--read-back-latency-ms", "profile,0"]).read_back_latency_ms == [None, 0.0]
    with pytest.raises(SystemExit):
        bench.parse_args(["--read-back-latency-ms", "fast"])

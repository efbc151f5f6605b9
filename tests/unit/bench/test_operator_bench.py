"""The operator benchmark's pure parts: the fleet and servings it creates, latencies and their spread, audit
counting, growth and the targets, and the report (no cluster: bench/operator_bench.py runs the real one)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))

import operator_fleet as fleet
import operator_report as report
import operator_stats as stats

from duplex.render import desired_children, parse


def test_the_bench_serving_is_a_valid_seed_at_tp1_that_eight_share_a_p5en():
    doc = fleet.serving("s-001", "ns")
    assert doc["metadata"] == {"name": "s-001", "namespace": "ns"}
    serving = parse(doc)
    spec = serving.spec
    assert spec.prefill.tensor_parallel_size == spec.decode.tensor_parallel_size == 1
    assert spec.kv_transfer.bidirectional and spec.network.efa.enabled
    objects = desired_children(serving)
    kinds = sorted(o["kind"] for o in objects)
    assert kinds.count("Deployment") == 3
    gpu = next(n for n in fleet.fleet(1) if n["metadata"]["name"].startswith("p5en"))["status"]["allocatable"]
    engine = next(o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("prefill"))
    requests = engine["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]
    assert int(gpu["nvidia.com/gpu"]) // int(requests["nvidia.com/gpu"]) == fleet.ENGINES_PER_GPU_NODE
    assert int(gpu["vpc.amazonaws.com/efa"]) // int(requests["vpc.amazonaws.com/efa"]) == fleet.ENGINES_PER_GPU_NODE


def test_the_fleet_holds_every_pod_with_distinct_names_cidrs_and_addresses():
    assert fleet.node_counts(200) == (50, 4)
    assert fleet.node_counts(5) == (2, 1)
    nodes = fleet.fleet(200)
    assert len(nodes) == 54
    for key in (
        lambda n: n["metadata"]["name"],
        lambda n: n["spec"]["podCIDR"],
        lambda n: n["spec"]["providerID"],
        lambda n: n["status"]["addresses"][0]["address"],
    ):
        assert len({key(n) for n in nodes}) == len(nodes)
    assert all(n["metadata"]["labels"]["kubernetes.io/hostname"] == n["metadata"]["name"] for n in nodes)
    assert all(n["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "fake" for n in nodes)


def test_latencies_pair_objects_and_spread_reports_percentiles():
    lat = stats.latencies({"a": 1.0, "b": 2.0, "c": 3.0}, {"a": 1.5, "b": 4.0})
    assert lat == {"a": 0.5, "b": 2.0}
    s = stats.spread([float(x) for x in range(1, 101)])
    assert s["n"] == 100 and s["p50"] == pytest.approx(50.5) and s["p99"] == pytest.approx(99.01) and s["max"] == 100
    assert math.isnan(stats.spread([])["p99"])


def ev(verb: str, resource: str | None, uri: str = "/x", sub: str | None = None) -> dict:
    ref = {"resource": resource, **({"subresource": sub} if sub else {})} if resource else {}
    return {"verb": verb, "objectRef": ref, "requestURI": uri}


def test_classify_counts_writes_and_resumed_watches_apart():
    requests = [
        ev("watch", "deployments", "/apis/apps/v1/deployments?watch=true&resourceVersion=12"),
        ev("watch", "pods", "/api/v1/pods?watch=true"),  # a fresh watch, not a resumed one
        ev("patch", "disaggregatedservings", sub="status"),
        ev("create", "deployments"),
        ev("get", None, "/apis"),
    ]
    c = stats.classify(requests)
    assert (c["requests"], c["writes"], c["resumed_watches"], c["other"]) == (5, 2, 1, 4)
    assert c["by_verb_resource"]["patch disaggregatedservings/status"] == 1
    assert c["by_verb_resource"]["get /apis"] == 1


def test_idle_summary_divides_by_resync_periods():
    requests = [ev("watch", "pods", "/api/v1/pods?watch=true&resourceVersion=3")]
    s = stats.idle_summary(requests, window_s=300, resync_s=60, passes=1000, servings=200)
    assert s["resync_periods"] == 5 and s["requests_per_resync"] == pytest.approx(0.2)
    assert s["other_per_resync"] == 0 and s["writes"] == 0 and s["passes_expected"] == 1000


def test_growth_is_a_ratio_and_an_exponent():
    g = stats.growth([10, 200], [1.0, 20.0])
    assert g["ratio"] == pytest.approx(20) and g["exponent"] == pytest.approx(1.0)
    assert stats.growth([10, 200], [5.0, 5.0])["exponent"] == pytest.approx(0.0)
    assert math.isnan(stats.growth([10, 200], [0.0, 0.0])["ratio"])
    assert math.isnan(stats.growth([10, 200], [math.nan, 3.0])["ratio"])
    assert math.isnan(stats.growth([10], [1.0])["ratio"])


def row(n: int, ready_s: float | None, p99: float, writes: int, peak: float) -> dict:
    idle = stats.idle_summary([ev("patch", "deployments")] * writes, 300, 60, 5 * n, n)
    return {
        "servings": n,
        "create_s": 1.0,
        "all_ready_s": ready_s,
        "ready": n if ready_s is not None else n - 1,
        "children_s": {"n": n, "p50": p99 / 2, "p99": p99, "max": p99},
        "single_children_s": {"n": 10, "p50": p99 / 4, "p99": p99 / 2, "max": p99 / 2},
        "ready_s": {"n": n, "p50": 5.0, "p99": 9.0, "max": 9.0},
        "converge_requests": {"requests": 15 * n, "writes": 15 * n, "per_serving": 15.0},
        "idle": idle,
        "converge_cpu_s": n / 10,
        "idle_cpu_pct": 1.0,
        "rss_mib": {"converged": peak - 5, "idle_end": peak - 2, "peak": peak},
    }


def test_verdicts_judge_the_largest_size():
    met = stats.verdicts(row(200, 40.0, 0.5, 0, 150.0))
    assert [v["met"] for v in met] == [True, True, True, True, True]
    missed = stats.verdicts(row(200, None, 1.5, 2, 250.0))
    assert [v["met"] for v in missed] == [False, False, True, False, False]
    assert missed[0]["measured"] == "199 Ready" and missed[3]["measured"] == "2 writes"


def test_markdown_has_the_command_targets_and_one_row_per_size():
    results = {
        "command": "python bench/operator_bench.py --sizes 10,200",
        "machine": {"git_commit": "abc1234", "nproc": 2, "cpu_model": "cpu", "mem_total_gib": 24, "kernel": "6",
                    "python": "3.12"},
        "load_before": (1.0, 1.0, 1.0), "load_after": (2.0, 1.0, 1.0), "wall_s": 600.0,
        "nodes": {"p5en.48xlarge": 50, "m7i.4xlarge": 4}, "resync_seconds": 60.0, "clients": 4,
        "idle_seconds": 300.0, "complete": True,
        "rows": [row(10, 5.0, 0.2, 0, 90.0), row(200, 50.0, 0.8, 0, 160.0)],
    }  # fmt: skip
    report.analyse(results)
    text = report.markdown(results)
    assert "`python bench/operator_bench.py --sizes 10,200`" in text and "abc1234" in text
    assert text.count("| yes |") == 5 and "**no**" not in text
    assert "| 10 | 300 |" in text and "| 200 | 300 |" in text
    growth = {g["metric"]: g for g in results["growth"]}
    assert growth["CPU seconds to converge"]["exponent"] == pytest.approx(1.0)

"""The fabric watch's arithmetic: the engines' NIXL counters between two scrapes -> read bandwidth, failures,
expired reads, and a verdict that names a slow or failing engine."""

from __future__ import annotations

from duplex_sidecars.router.endpoints import DECODE, PREFILL, Engines
from duplex_sidecars.router.fabric import EngineFabric, FabricWatch, counters_of, judge
from duplex_sidecars.router.metrics import RouterMetrics


def scrape(bytes_: float, seconds: float, reads: float, failed: float = 0, expired: float = 0) -> str:
    labels = '{model_name="m",engine="0"}'
    return "\n".join(
        [
            "# TYPE vllm:nixl_bytes_transferred histogram",
            f"vllm:nixl_bytes_transferred_sum{labels} {bytes_}",
            f"vllm:nixl_bytes_transferred_count{labels} {reads}",
            "# TYPE vllm:nixl_xfer_time_seconds histogram",
            f"vllm:nixl_xfer_time_seconds_sum{labels} {seconds}",
            f"vllm:nixl_xfer_time_seconds_count{labels} {reads}",
            "# TYPE vllm:nixl_num_failed_transfers counter",
            f"vllm:nixl_num_failed_transfers_total{labels} {failed}",
            "# TYPE vllm:nixl_num_kv_expired_reqs counter",
            f"vllm:nixl_num_kv_expired_reqs_total{labels} {expired}",
            "",
        ]
    )


def test_counters_are_read_off_vllms_histograms():
    got = counters_of(scrape(4e9, 2.0, 10, 1, 2))
    assert got["vllm:nixl_bytes_transferred_sum"] == 4e9 and got["vllm:nixl_xfer_time_seconds_count"] == 10
    assert got["vllm:nixl_num_failed_transfers_total"] == 1 and got["vllm:nixl_num_kv_expired_reqs_total"] == 2


def watch() -> tuple[FabricWatch, RouterMetrics]:
    metrics = RouterMetrics()
    engines = Engines(metrics)
    return FabricWatch(engines, None, metrics, "LIBFABRIC", 15.0), metrics  # type: ignore[arg-type]


def test_bandwidth_is_the_deltas_between_scrapes_and_goes_to_the_pairs_read():
    fabric, metrics = watch()
    engine = EngineFabric("http://p0", PREFILL)
    # The first scrape counts every read since the engine started (its counters start at zero with it): reads of a
    # conversation that ended before the router first looked are measured too.
    fabric._update(engine, counters_of(scrape(1e9, 1.0, 5)), set())
    assert engine.gbps == 1.0 and engine.reads == 5
    fabric._update(engine, counters_of(scrape(1e9 + 8e9, 1.0 + 2.0, 9, failed=1, expired=1)), {"http://d0"})
    assert engine.gbps == 4.0 and engine.reads == 4 and engine.read_from == {"http://d0"}
    assert metrics.total("duplex_router_kv_read_bandwidth_bytes_per_second", endpoint="http://p0") == 4e9
    assert (
        metrics.total("duplex_router_kv_pair_bandwidth_bytes_per_second", reader="http://p0", owner="http://d0") == 4e9
    )
    assert metrics.total("duplex_router_kv_transfer_failures_total", endpoint="http://p0") == 1
    assert metrics.total("duplex_router_kv_expired_reads_total", endpoint="http://p0") == 1
    # an engine that restarted starts its counters from zero: no negative deltas
    fabric._update(engine, counters_of(scrape(0, 0, 0)), set())
    assert engine.gbps == 4.0 and metrics.total("duplex_router_kv_transfer_failures_total") == 1


def test_the_verdict_names_a_tcp_fallback_and_failing_transfers():
    fast = EngineFabric("http://p0", PREFILL, gbps=12.0, reads=10)
    slow = EngineFabric("http://d0", DECODE, gbps=0.3, reads=10)
    ok, message = judge([fast], "LIBFABRIC")
    assert ok and "12.00" in message
    ok, message = judge([fast, slow], "LIBFABRIC")
    assert not ok and "0.30 GB/s" in message and "http://d0" in message and "TCP fallback?" in message
    assert judge([slow], "UCX")[0]  # 0.3 GB/s is what UCX over TCP gives
    failing = EngineFabric("http://p1", PREFILL, gbps=5.0, reads=4, failed=3)
    ok, message = judge([failing], "LIBFABRIC")
    assert not ok and "3 of 7 KV transfers failed" in message
    assert judge([], "UCX") == (True, "no KV transfers measured yet")
    # a few small reads measure latency, not bandwidth
    tiny = EngineFabric("http://d1", DECODE, gbps=0.01, reads=3, read_bytes=64 * 1024)
    assert judge([tiny], "LIBFABRIC", min_read_bytes=32 * 2**20)[0]

"""The engine's Prometheus metrics, with vLLM's names where vLLM has the metric, `sim_*` for simulator checks."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

# vLLM's TTFT buckets (vllm/v1/metrics/loggers.py).
_TTFT_BUCKETS = (
    *(0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75),
    *(1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0),
)


# vLLM's NIXL histograms (distributed/kv_transfer/kv_connector/v1/nixl/stats.py).
_XFER_TIME_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0)
_XFER_BYTES_BUCKETS = tuple(float(2 ** (10 + i)) for i in range(1, 25, 2))


class SimMetrics:
    """One registry per engine, so several engines can live in one test process."""

    def __init__(self, model: str, engine: str = "0"):
        self.registry = CollectorRegistry()
        labels = {"model_name": model, "engine": engine}
        r = self.registry

        def counter(name: str, doc: str, extra: tuple[str, ...] = ()) -> Counter:
            return Counter(name, doc, (*labels, *extra), registry=r)

        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds", "Time to first token.", list(labels), buckets=_TTFT_BUCKETS, registry=r
        ).labels(**labels)
        self.num_requests_running = Gauge(
            "vllm:num_requests_running", "Requests being served.", list(labels), registry=r
        ).labels(**labels)
        self.num_requests_waiting = Gauge(
            "vllm:num_requests_waiting", "Requests waiting (the simulator never queues).", list(labels), registry=r
        ).labels(**labels)
        self.num_requests_waiting.set(0)
        self._prompt_by_source = counter(
            "vllm:prompt_tokens_by_source", "Prompt tokens by where their KV came from.", ("source",)
        )
        self.prompt_tokens = counter("vllm:prompt_tokens", "Prefill tokens processed.").labels(**labels)
        self.generation_tokens = counter("vllm:generation_tokens", "Generation tokens processed.").labels(**labels)
        self._request_success = counter("vllm:request_success", "Finished requests.", ("finished_reason",))
        self.kv_expired_reqs = counter(
            "vllm:nixl_num_kv_expired_reqs", "Remote reads declined because the blocks expired or were about to."
        ).labels(**labels)
        self.failed_kv_loads = counter(
            "vllm:nixl_num_failed_transfers", "Remote KV loads that failed (declined, gone, errored, corrupt)."
        ).labels(**labels)
        self.corrupt_blocks = counter(
            "sim_corrupt_blocks", "Blocks read over NIXL whose bytes did not match their token prefix."
        ).labels(**labels)
        self.nixl_reads = counter("sim_nixl_reads", "NIXL READ transfers completed.").labels(**labels)
        self.xfer_time = Histogram(
            "vllm:nixl_xfer_time_seconds",
            "Histogram of transfer duration for NIXL KV Cache transfers.",
            list(labels),
            buckets=_XFER_TIME_BUCKETS,
            registry=r,
        ).labels(**labels)
        self.xfer_bytes = Histogram(
            "vllm:nixl_bytes_transferred",
            "Histogram of bytes transferred per NIXL KV Cache transfers.",
            list(labels),
            buckets=_XFER_BYTES_BUCKETS,
            registry=r,
        ).labels(**labels)
        self.nixl_bytes_read = counter("sim_nixl_bytes_read", "Bytes read over NIXL.").labels(**labels)
        self.retained_blocks = Gauge(
            "sim_retained_blocks",
            "Blocks held for a remote reader (decode's TTL or prefill's lease).",
            list(labels),
            registry=r,
        ).labels(**labels)
        self._recompute_skips = counter(
            "sim_recompute_skips", "Remote KV pulls skipped, so the tokens were computed locally.", ("reason",)
        )
        self._labels = labels

    def prompt_tokens_by_source(self, local_compute: int, local_cache_hit: int, external_kv_transfer: int) -> None:
        for source, n in (
            ("local_compute", local_compute),
            ("local_cache_hit", local_cache_hit),
            ("external_kv_transfer", external_kv_transfer),
        ):
            self._prompt_by_source.labels(**self._labels, source=source).inc(n)

    def recompute_skip(self, reason: str) -> None:
        self._recompute_skips.labels(**self._labels, reason=reason).inc()

    def request_success(self, finished_reason: str) -> None:
        self._request_success.labels(**self._labels, finished_reason=finished_reason).inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

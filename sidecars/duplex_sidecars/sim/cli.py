"""`duplex sim`: run one simulated vLLM engine (HTTP API + NIXL side channel) until SIGTERM/SIGINT."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import uuid

from aiohttp import web

from duplex_sidecars.event_loop import run_loop
from duplex_sidecars.protocol import KV_REVISION_ENV, KV_REVISION_HEADER
from duplex_sidecars.sim.config import SimConfig
from duplex_sidecars.sim.cost import CostModel, load_profile

log = logging.getLogger("duplex.sim")

_DESCRIPTION = """\
A CPU-only stand-in for a vLLM engine with NixlConnector and bidirectional KV transfer. It speaks vLLM's API
(/v1/chat/completions, /v1/completions, /v1/responses, /v1/messages, /v1/models, /health, /metrics) and
kv_transfer_params, keeps KV blocks in a DRAM buffer registered with NIXL, READs remote blocks over NIXL (UCX) and
verifies every block it reads.
Like vLLM, what a request does follows its kv_transfer_params (do_remote_decode = prefill leg, otherwise decode
leg); --role only names the engine. Cost-model delays default to 0 so tests run at full speed."""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="duplex sim", description=_DESCRIPTION, formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument(
        "--role",
        choices=("prefill", "decode"),
        required=True,
        help="engine role (names the engine; requests follow their kv_transfer_params)",
    )
    p.add_argument("--host", default="127.0.0.1", help="address of the HTTP API and the side channel")
    p.add_argument("--port", type=int, default=8000, help="HTTP API port")
    p.add_argument(
        "--side-channel-port",
        type=int,
        default=5600,
        help="NIXL side-channel port (vLLM's VLLM_NIXL_SIDE_CHANNEL_PORT), returned as remote_port",
    )
    p.add_argument(
        "--side-channel-host",
        default=None,
        help="host advertised as remote_host (vLLM's VLLM_NIXL_SIDE_CHANNEL_HOST); None = --host",
    )
    p.add_argument(
        "--engine-id", default=None, help="engine id returned as remote_engine_id; None = sim-<role>-<random>"
    )
    p.add_argument(
        "--api-key",
        default=os.environ.get("VLLM_API_KEY") or None,
        help="refuse /v1/* without this Bearer token (401), as vLLM does; default: $VLLM_API_KEY",
    )
    p.add_argument(
        "--key-on-every-path",
        action="store_true",
        help="require the key on every path but /health and /metrics, as duplex's engine guard does in vLLM",
    )
    p.add_argument(
        "--kv-revision",
        default=os.environ.get(KV_REVISION_ENV, "").strip() or None,
        help=f"KV revision named on every answer ({KV_REVISION_HEADER}), as the engine guard does in vLLM; "
        f"default: ${KV_REVISION_ENV}",
    )
    p.add_argument("--model", "--served-model-name", dest="model", default="sim", help="served model name")
    p.add_argument("--max-model-len", type=int, default=32768, help="prompt + output token limit")
    kv = p.add_argument_group("KV cache")
    kv.add_argument("--block-size", type=int, default=16, help="tokens per KV block")
    kv.add_argument("--num-blocks", type=int, default=4096, help="KV blocks in the engine's buffer")
    kv.add_argument("--block-bytes", type=int, default=4096, help="bytes per KV block (a multiple of --block-size)")
    kv.add_argument(
        "--enable-prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="reuse cached blocks of identical prompt prefixes",
    )
    bi = p.add_argument_group("NixlConnector (kv_connector_extra_config)")
    bi.add_argument(
        "--bidirectional",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="bidirectional_kv_xfer: decode retains blocks and returns params; prefill reads them",
    )
    bi.add_argument(
        "--kv-recompute-threshold",
        type=int,
        default=64,
        help="prefill recomputes when 0 < remote tokens beyond its cache hits < this (0 disables)",
    )
    bi.add_argument("--decoder-kv-blocks-ttl", type=float, default=480.0, help="seconds decode retains blocks")
    bi.add_argument(
        "--kv-lease-duration", type=float, default=30.0, help="seconds prefill keeps blocks for decode to read"
    )
    bi.add_argument(
        "--kv-load-failure-policy",
        choices=("recompute", "fail"),
        default="fail",
        help="on a failed/declined/expired/corrupt remote load: recompute locally or fail the request",
    )
    bi.add_argument("--nixl-backend", default="UCX", help="NIXL backend plugin")
    bi.add_argument(
        "--no-stream-kv-params",
        dest="stream_kv_params",
        action="store_false",
        help="behave like vLLM 0.32: no kv_transfer_params in streamed answers (0.33 sends them on the last chunk)",
    )
    bi.add_argument(
        "--fail-on-corrupt",
        action="store_true",
        help="test mode: a block that fails verification makes the request fail with HTTP 500",
    )
    cost = p.add_argument_group("cost model (all 0 = no simulated compute time)")
    cost.add_argument(
        "--cost-profile",
        metavar="FILE",
        help="JSON file whose `cost` object sets the fields below (bench/results/sim-cost.json is fitted to real "
        "vLLM CPU engines); a flag given as well overrides its field",
    )
    cost.add_argument("--prefill-us-per-token", type=float, help="prefill time per computed token")
    cost.add_argument(
        "--prefill-attention-us-per-token2", type=float, help="attention term: per (new token x context token) pair"
    )
    cost.add_argument("--decode-us-per-token", type=float, help="time per generated token")
    cost.add_argument(
        "--transfer-gbps",
        type=float,
        help="simulated KV transfer bandwidth in Gbit/s (0 = only the real NIXL copy time)",
    )
    cost.add_argument(
        "--read-back-latency-ms", type=float, help="fixed time of prefill reading decode's blocks, beside the transfer"
    )
    cost.add_argument(
        "--time-scale", type=float, default=1.0, help="multiply every simulated duration by this (0.1: 10x faster)"
    )
    tr = p.add_argument_group("traces (vLLM's --otlp-traces-endpoint)")
    tr.add_argument(
        "--otlp-traces-endpoint",
        metavar="URL",
        help="export a span per request (vLLM's llm_request, parented by the request's traceparent) and one per KV "
        "read to this OTLP endpoint, given as vLLM takes it (http/protobuf: the full URL, "
        "http://collector:4318/v1/traces); default: no spans",
    )
    tr.add_argument(
        "--otlp-traces-protocol",
        choices=("grpc", "http/protobuf"),
        default=os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or "grpc",
        help="OTLP protocol, as vLLM picks it from $OTEL_EXPORTER_OTLP_TRACES_PROTOCOL (grpc needs "
        "opentelemetry-exporter-otlp-proto-grpc, which the simulator does not ship)",
    )
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    return p


def config_from_args(args: argparse.Namespace) -> SimConfig:
    if args.block_size <= 0 or args.block_bytes <= 0 or args.block_bytes % args.block_size:
        raise SystemExit("duplex sim: --block-bytes must be a positive multiple of --block-size")
    if args.num_blocks <= 0:
        raise SystemExit("duplex sim: --num-blocks must be positive")
    if args.otlp_traces_endpoint:
        from duplex_sidecars.sim.tracing import TracingUnavailable, check_protocol

        try:
            check_protocol(args.otlp_traces_protocol)
        except TracingUnavailable as e:
            raise SystemExit(f"duplex sim: --otlp-traces-endpoint: {e}") from e
    return SimConfig(
        role=args.role,
        host=args.host,
        port=args.port,
        side_channel_host=args.side_channel_host,
        side_channel_port=args.side_channel_port,
        engine_id=args.engine_id or f"sim-{args.role}-{uuid.uuid4().hex[:8]}",
        model=args.model,
        api_key=args.api_key,
        key_on_every_path=args.key_on_every_path,
        kv_revision=args.kv_revision,
        max_model_len=args.max_model_len,
        block_size=args.block_size,
        num_blocks=args.num_blocks,
        block_bytes=args.block_bytes,
        enable_prefix_caching=args.enable_prefix_caching,
        bidirectional=args.bidirectional,
        stream_kv_params=args.stream_kv_params,
        kv_recompute_threshold=args.kv_recompute_threshold,
        decoder_kv_blocks_ttl=args.decoder_kv_blocks_ttl,
        kv_lease_duration=args.kv_lease_duration,
        kv_load_failure_policy=args.kv_load_failure_policy,
        nixl_backend=args.nixl_backend,
        fail_on_corrupt=args.fail_on_corrupt,
        cost=cost_from_args(args),
        otlp_traces_endpoint=args.otlp_traces_endpoint,
        otlp_traces_protocol=args.otlp_traces_protocol,
    )


def cost_from_args(args: argparse.Namespace) -> CostModel:
    for flag in (
        "prefill_us_per_token",
        "prefill_attention_us_per_token2",
        "decode_us_per_token",
        "transfer_gbps",
        "read_back_latency_ms",
    ):
        if (getattr(args, flag) or 0) < 0:
            raise SystemExit(f"duplex sim: --{flag.replace('_', '-')} must be >= 0")
    if args.time_scale <= 0:
        raise SystemExit("duplex sim: --time-scale must be positive")
    try:
        base = load_profile(args.cost_profile) if args.cost_profile else CostModel()
    except ValueError as e:
        raise SystemExit(f"duplex sim: {e}") from e
    latency_us = None if args.read_back_latency_ms is None else args.read_back_latency_ms * 1000
    cost = base.replace(
        prefill_us_per_token=args.prefill_us_per_token,
        prefill_attention_us_per_token2=args.prefill_attention_us_per_token2,
        decode_us_per_token=args.decode_us_per_token,
        transfer_gbps=args.transfer_gbps,
        read_back_latency_us=latency_us,
    )
    return cost.scaled(args.time_scale)


async def serve(cfg: SimConfig) -> None:
    from duplex_sidecars.sim.engine import Engine
    from duplex_sidecars.sim.http_api import OpenAIApi
    from duplex_sidecars.sim.side_channel import side_channel_app

    engine = Engine(cfg)
    await engine.start()
    api_runner = web.AppRunner(OpenAIApi(engine).app(), access_log=None)
    side_runner = web.AppRunner(side_channel_app(engine), access_log=None)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        for runner, port in ((side_runner, cfg.side_channel_port), (api_runner, cfg.port)):
            await runner.setup()
            await web.TCPSite(runner, cfg.host, port).start()
        log.info(
            "duplex sim %s engine %s serving model %r on http://%s:%d (side channel %s:%d, bidirectional=%s)",
            cfg.role,
            cfg.engine_id,
            cfg.model,
            cfg.host,
            cfg.port,
            cfg.advertised_host,
            cfg.side_channel_port,
            cfg.bidirectional,
        )
        await stop.wait()
    finally:
        await api_runner.cleanup()
        await side_runner.cleanup()
        await engine.stop()


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    cfg = config_from_args(args)
    logging.basicConfig(
        level=args.log_level.upper(), stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    from duplex_sidecars.sim.nixl_transport import NixlUnavailable

    try:
        run_loop(serve(cfg))
    except NixlUnavailable as e:
        print(f"duplex sim: {e}", file=sys.stderr)
        return 1
    except OSError as e:  # typically a port already in use
        print(f"duplex sim: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

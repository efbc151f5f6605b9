"""`duplex router`: run the KV-aware router.

    duplex router --prefill URL --decode URL [--prefill URL ...] [--decode URL ...] [--host H] [--port P]
                  [--admin-port P] [--conversation-ttl SECONDS] [--config FILE]

Flags override the config file; the file is re-read when it changes.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import signal
import sys
from typing import Any

from duplex_sidecars.event_loop import run_loop
from duplex_sidecars.http1.server import FrontServer
from duplex_sidecars.router.app import Router, serve, shutdown
from duplex_sidecars.router.config_file import ConfigError, ConfigSource, flag_overrides

log = logging.getLogger("duplex.router")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="duplex router", description="KV-aware router for P-D disaggregated vLLM.")
    p.add_argument("--prefill", action="append", metavar="URL", help="prefill engine base URL (repeatable)")
    p.add_argument("--decode", action="append", metavar="URL", help="decode engine base URL (repeatable)")
    p.add_argument("--host", help="listen address (default 0.0.0.0)")
    p.add_argument("--port", type=int, help="listen port (default 8000)")
    p.add_argument("--admin-port", type=int, help="port of /metrics and /ready's detail (default: the API port)")
    p.add_argument(
        "--conversation-ttl",
        type=float,
        metavar="SECONDS",
        help="how long decode's retained blocks may be replayed; below the engines' decoder_kv_blocks_ttl",
    )
    p.add_argument("--config", metavar="FILE", help="router config file (YAML or JSON), reloaded on change")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    return p


def source_from_args(args: argparse.Namespace) -> ConfigSource:
    overrides = flag_overrides(
        args.prefill, args.decode, args.host, args.port, args.conversation_ttl, admin_port=args.admin_port
    )
    return ConfigSource(args.config, overrides)


async def _serve(router: Router, server_class: type[Any]) -> None:
    cfg = router.config
    server = await serve(router, cfg.host, cfg.port, server_class)
    admin = f"admin port {server.admin_port}" if server.admin_port is not None else "no admin port: /metrics on it"
    log.info(
        "router listening on %s:%d, %s (prefill %d, decode %d engines, store %s, event loop %s)",
        cfg.host,
        server.port,
        admin,
        len(router.engines.prefill),
        len(router.engines.decode),
        router.store.kind,
        type(asyncio.get_running_loop()).__module__.split(".")[0],
    )
    # Everything loaded so far lives as long as the process: keep it out of the collector's generations, so that a
    # full collection walks only what requests and conversations allocate.
    gc.collect()
    gc.freeze()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        grace = router.config.shutdown_grace_seconds
        log.info("router shutting down: requests in flight have %g s to finish", grace)
        await shutdown(server, router, grace)


def main(argv: list[str] | None = None, server_class: type[Any] = FrontServer) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    source = source_from_args(args)
    try:
        config = source.load()
    except ConfigError as exc:
        print(f"duplex router: {exc}", file=sys.stderr)
        return 2
    try:
        router = Router(config, source)
    except ValueError as exc:  # e.g. the Redis URL's environment variable is unset
        print(f"duplex router: {exc}", file=sys.stderr)
        return 2
    from prometheus_client import disable_created_metrics

    # Process-wide, and this process is the router: *_created series are noise here.
    disable_created_metrics()  # type: ignore[no-untyped-call]  # prometheus_client leaves this one unannotated
    try:
        run_loop(_serve(router, server_class))
    except OSError as exc:
        print(f"duplex router: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

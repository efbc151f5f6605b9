"""`duplex operator`: run the kopf operator against one namespace, several, or all."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os

import kopf
from prometheus_client import start_http_server

from duplex.policy import ENV as POLICY_ENV
from duplex.policy import Policy


def _workers(text: str) -> int:
    n = int(text)
    if not 1 <= n <= 64:
        raise argparse.ArgumentTypeError(f"{n} is not between 1 and 64")
    return n


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="duplex operator", description="Reconcile DisaggregatedServings.")
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument("--namespace", "-n", action="append", help="namespace to watch (repeatable)")
    scope.add_argument("--all-namespaces", "-A", action="store_true", help="watch every namespace (the default)")
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, then $KUBECONFIG)")
    parser.add_argument("--metrics-port", type=int, default=8080, help="Prometheus /metrics port (0: off)")
    parser.add_argument("--health-port", type=int, default=8081, help="liveness endpoint port (0: off)")
    parser.add_argument("--resync-seconds", type=float, help="periodic resync interval (default 60)")
    parser.add_argument("--workers", type=_workers, help="parents reconciled at once, 1-64 (default 8)")
    parser.add_argument(
        "--allow-privileged-efa",
        action="store_true",
        help="let servings ask for network.efa.privileged (privileged engine containers); off by default",
    )
    parser.add_argument(
        "--allow-host-path",
        action="append",
        default=[],
        metavar="PREFIX",
        help="a node directory under which model.cache.hostPath may point (repeatable); none: no hostPath",
    )
    parser.add_argument(
        "--allow-image",
        action="append",
        default=[],
        metavar="PREFIX",
        help="servings' images must start with one of these (repeatable), e.g. a registry; none given: any image",
    )
    parser.add_argument(
        "--allow-secret",
        action="append",
        default=[],
        metavar="NAME",
        help="the only Secrets of their namespace servings may read (repeatable); none given: any",
    )
    parser.add_argument(
        "--allow-toleration",
        action="append",
        default=[],
        metavar="KEY",
        help="a taint key servings' engines may tolerate (repeatable; * for any); none: no extra toleration",
    )
    parser.add_argument("--verbose", "-v", action="store_true")
    args = parser.parse_args(argv)
    for prefix in args.allow_host_path:
        if not prefix.startswith("/") or Policy(host_path_prefixes=(prefix,)).allows_host_path(prefix) is False:
            parser.error(f"--allow-host-path {prefix!r}: an absolute, plain directory path is needed")
    policy = Policy(
        args.allow_privileged_efa,
        tuple(args.allow_host_path),
        tuple(args.allow_image),
        tuple(args.allow_secret),
        tuple(args.allow_toleration),
    )
    os.environ[POLICY_ENV] = policy.to_env()

    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if not args.verbose:
        # kopf serves the liveness endpoint with aiohttp, which logs every probe (two every 5 s in a pod).
        logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    if args.kubeconfig:
        os.environ["DUPLEX_KUBECONFIG"] = args.kubeconfig
        os.environ["KUBECONFIG"] = args.kubeconfig
    if args.resync_seconds:
        os.environ["DUPLEX_RESYNC_SECONDS"] = str(args.resync_seconds)
    if args.workers:
        os.environ["DUPLEX_WORKERS"] = str(args.workers)
    import duplex.handlers  # noqa: F401  (registers the handlers)
    from duplex import discovery_retry

    discovery_retry.install()  # kopf may miss a CRD created while it runs (discovery_retry.py)

    if args.metrics_port:
        start_http_server(args.metrics_port)
    liveness = f"http://0.0.0.0:{args.health_port}/healthz" if args.health_port else None
    asyncio.run(
        kopf.operator(
            clusterwide=not args.namespace,
            namespaces=args.namespace or [],
            standalone=True,
            liveness_endpoint=liveness,
        )
    )
    return 0

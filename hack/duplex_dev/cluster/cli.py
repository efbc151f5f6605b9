"""`duplex-dev cluster up|down|status|kubeconfig`: the command-line shell around LocalCluster."""

from __future__ import annotations

import argparse
import signal
import sys

from duplex_dev.cluster.local import ClusterError, LocalCluster, default_state_dir
from duplex_dev.cluster.tools import ToolsMissing


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--dir", default=None, help=f"state dir (default: $DUPLEX_CLUSTER_DIR or {default_state_dir()})"
    )
    parser = argparse.ArgumentParser(
        prog="duplex-dev cluster",
        description="A local Kubernetes cluster: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, "
        "kwok with fake EKS EFA GPU nodes, and real nodes (containerd, runc, kubelet, kube-proxy, each in a network "
        "namespace of its own, addresses from 198.18.0.0/15) where pods really run.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", parents=[common], help="start the cluster (idempotent)")
    up.add_argument(
        "--bin-dir",
        default=None,
        help="dir with the binaries (default: $DUPLEX_BIN, else built or reused by hack/build-tools.sh)",
    )
    up.add_argument(
        "--no-build", action="store_true", help="do not run hack/build-tools.sh; fail if the binaries are missing"
    )
    up.add_argument(
        "--nodes", default=None, help="node manifests to register (default: tests/fixtures/fake-nodes.yaml)"
    )
    up.add_argument("--timeout", type=float, default=300.0, help="overall startup deadline in seconds (default 300)")
    up.add_argument(
        "--no-real-node", action="store_true", help="the control plane and the fake fleet only (no root needed)"
    )
    up.add_argument(
        "--real-nodes",
        type=int,
        default=1,
        metavar="N",
        help="real nodes to run, each in a slot of its own (default 1: duplex-node; 2 adds duplex-node-b, which a "
        "node drain needs to move pods to)",
    )
    sub.add_parser("down", parents=[common], help="stop every component and remove the runtime state")
    sub.add_parser("status", parents=[common], help="component health and nodes; exit 1 when not running")
    sub.add_parser("kubeconfig", parents=[common], help="print the admin kubeconfig path")
    load = sub.add_parser("load-image", parents=[common], help="import an image into every real node's containerd")
    load.add_argument("image", nargs="?", default=None, help="image in buildah's storage (default: the project's)")
    return parser


def _terminated(signum, frame):
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        if args.command == "up":
            # A terminated `up` must still stop what it started: turn SIGTERM into an exception startup cleans up on.
            signal.signal(signal.SIGTERM, _terminated)
            cluster = LocalCluster(
                args.dir,
                bin_dir=args.bin_dir,
                nodes_file=args.nodes,
                real_nodes=0 if args.no_real_node else args.real_nodes,
            )
            cluster.up(timeout=args.timeout, build=not args.no_build)
            print(cluster.kubeconfig)
            return 0
        cluster = LocalCluster(args.dir)
        if args.command == "down":
            stopped = cluster.down()
            print(f"stopped: {', '.join(stopped)}" if stopped else f"nothing was running in {cluster.state_dir}")
            return 0
        if args.command == "status":
            status = cluster.status()
            print(status.render())
            return 0 if status.running else 1
        if args.command == "load-image":
            from duplex_dev import images

            print(cluster.import_image(images.archive(args.image)))
            return 0
        if args.command == "kubeconfig":
            if not cluster.status(with_nodes=False).components:
                print(f"no cluster in {cluster.state_dir}: run `duplex-dev cluster up`", file=sys.stderr)
                return 1
            print(cluster.kubeconfig)
            return 0
    except ToolsMissing as err:
        print(f"duplex-dev cluster: {err}; run hack/setup.sh (or bash hack/build-tools.sh)", file=sys.stderr)
        return 3
    except ClusterError as err:
        print(f"duplex-dev cluster: FAILED: {err}", file=sys.stderr)
        return 1
    except RuntimeError as err:  # an image that is not built (images.ImageMissing), a failed import
        print(f"duplex-dev cluster: {err}", file=sys.stderr)
        return 1
    return 2

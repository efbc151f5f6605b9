"""The `duplex-dev` command: development tooling (local control plane, demo) beside the product's `duplex`."""

from __future__ import annotations

import sys

from duplex.cli import dispatch

# subcommand -> (module with `main(argv) -> int`, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "cluster": ("duplex_dev.cluster.cli", "run a local control plane with fake EFA GPU nodes"),
    "calibrate": ("duplex_dev.calibrate", "this machine's recompute threshold, measured with real CPU vLLM engines"),
    "demo": ("duplex_dev.demo", "end-to-end demo: local cluster, operator, seed example, live multi-turn chat"),
}


def main(argv: list[str] | None = None) -> int:
    return dispatch("duplex-dev", SUBCOMMANDS, sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    sys.exit(main())

"""The `duplex-dev` command: development tooling (local control plane, demo) beside the product's `duplex`."""

from __future__ import annotations

import importlib
import sys

# subcommand -> (module with `main(argv) -> int`, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "cluster": ("duplex_dev.cluster.cli", "run a local control plane with fake EFA GPU nodes"),
    "calibrate": ("duplex_dev.calibrate", "this machine's recompute threshold, measured with real CPU vLLM engines"),
    "demo": ("duplex_dev.demo", "end-to-end demo: local cluster, operator, seed example, live multi-turn chat"),
}


def _usage() -> str:
    lines = ["usage: duplex-dev <command> [options]", "", "commands:"]
    lines += [f"  {name:<10} {help_}" for name, (_, help_) in SUBCOMMANDS.items()]
    lines += ["", "Run 'duplex-dev <command> --help' for a command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    entry = SUBCOMMANDS.get(args[0])
    if entry is None:
        print(f"duplex-dev: unknown command {args[0]!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(entry[0])
    return int(module.main(args[1:]) or 0)


if __name__ == "__main__":
    sys.exit(main())

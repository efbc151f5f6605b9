"""The `duplex` command: one entry point whose subcommands live in their own modules."""

from __future__ import annotations

import importlib
import sys

# subcommand -> (module with `main(argv) -> int`, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "operator": ("duplex.operator_cli", "run the kopf operator"),
    "render": ("duplex.render_cli", "print the child objects the operator would create"),
    "crds": ("duplex.crd_cli", "print the DisaggregatedServing CRD"),
    "router": ("duplex_sidecars.router.cli", "run the KV-aware router"),
    "sim": ("duplex_sidecars.sim.cli", "run a simulated vLLM engine (prefill or decode)"),
    "preflight": ("duplex_sidecars.preflight.cli", "check an engine pod's fabric (EFA, hugepages, memlock, NIXL)"),
    "calibrate": ("duplex.calibrate_cli", "the recompute threshold a running router measures"),
}


def _usage() -> str:
    lines = ["usage: duplex <command> [options]", "", "commands:"]
    lines += [f"  {name:<10} {help_}" for name, (_, help_) in SUBCOMMANDS.items()]
    lines += ["", "Run 'duplex <command> --help' for a command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    if args[0] == "--version":
        from duplex import __version__

        print(__version__)
        return 0
    entry = SUBCOMMANDS.get(args[0])
    if entry is None:
        print(f"duplex: unknown command {args[0]!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(entry[0])
    return int(module.main(args[1:]) or 0)


if __name__ == "__main__":
    sys.exit(main())

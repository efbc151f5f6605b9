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


def _usage(prog: str, subcommands: dict[str, tuple[str, str]]) -> str:
    lines = [f"usage: {prog} <command> [options]", "", "commands:"]
    lines += [f"  {name:<10} {help_}" for name, (_, help_) in subcommands.items()]
    lines += ["", f"Run '{prog} <command> --help' for a command's options."]
    return "\n".join(lines)


def dispatch(prog: str, subcommands: dict[str, tuple[str, str]], args: list[str]) -> int:
    """Run the subcommand `args` names with the rest of them (`duplex` and `duplex-dev` share this)."""
    if not args or args[0] in ("-h", "--help", "help"):
        print(_usage(prog, subcommands))
        return 0
    entry = subcommands.get(args[0])
    if entry is None:
        print(f"{prog}: unknown command {args[0]!r}\n\n{_usage(prog, subcommands)}", file=sys.stderr)
        return 2
    module = importlib.import_module(entry[0])
    return int(module.main(args[1:]) or 0)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["--version"]:
        from duplex import __version__

        print(__version__)
        return 0
    return dispatch("duplex", SUBCOMMANDS, args)


if __name__ == "__main__":
    sys.exit(main())

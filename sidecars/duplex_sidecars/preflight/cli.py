"""`duplex preflight`: run the fabric checks, print one line per check on stderr, the JSON report on stdout (or
--json), the compact report to the termination log; exit 0 when nothing failed, 1 otherwise."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from duplex_sidecars.preflight import efa_devices, fabric_env, hugepages, libfabric, memlock, nixl_checks
from duplex_sidecars.preflight.quantity import parse_bytes, to_quantity
from duplex_sidecars.preflight.result import CheckResult, Report, check_lines, summary_line, termination_message

BACKENDS = ("UCX", "LIBFABRIC")
KUBERNETES_TERMINATION_LOG = "/dev/termination-log"
NAMES = (efa_devices.NAME, libfabric.NAME, hugepages.NAME, memlock.NAME, fabric_env.NAME,
         nixl_checks.BACKEND, nixl_checks.LOOPBACK)  # fmt: skip

_DESCRIPTION = """\
Prove that what the spec promises an engine pod is there: EFA devices, libfabric's efa provider, hugepages,
memlock/IPC_LOCK, a fabric environment without a silent TCP fallback, and a NIXL backend that loads and moves
verified bytes between two agents at more than a floor. Meant as an init container of engine pods; exit 0 = ready,
1 = not (warnings do not fail without --strict). With --backend UCX the EFA checks are skipped (and say so) unless
--efa-devices asks for devices."""


def _bytes(text: str) -> int:
    try:
        return parse_bytes(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="duplex preflight", description=_DESCRIPTION)
    p.add_argument("--backend", type=str.upper, choices=BACKENDS, default="UCX",
                   help="the NIXL backend the engine uses (vLLM's kv_connector_extra_config.backends); default UCX")  # fmt: skip
    p.add_argument("--efa-devices", type=int, default=0, metavar="N",
                   help="EFA devices the pod requests (vpc.amazonaws.com/efa); 0 = not requested, at least 1 with "
                        "LIBFABRIC")  # fmt: skip
    p.add_argument("--hugepages", type=_bytes, default=0, metavar="QUANTITY",
                   help="2 MiB hugepages the pod requests (hugepages-2Mi), e.g. 5120Mi; default: not requested")  # fmt: skip
    p.add_argument("--root", type=Path, default=Path("/"),
                   help="where /dev, /proc and /sys and the image's libraries are read from (a fixture tree in tests)")  # fmt: skip
    p.add_argument("--library-path", default=None, metavar="DIRS",
                   help="library directories to look for libfabric in; default: $LD_LIBRARY_PATH")  # fmt: skip
    p.add_argument("--size", type=_bytes, default=64 << 20, metavar="QUANTITY",
                   help="bytes per loopback READ (default 64Mi); the check registers twice this")  # fmt: skip
    p.add_argument("--iterations", type=int, default=8, help="timed loopback READs (default 8)")
    p.add_argument("--min-gbps", type=float, default=None, metavar="GB/S",
                   help="loopback bandwidth floor in GB/s (10^9 bytes/s); default "
                        + ", ".join(f"{k} {v:g}" for k, v in nixl_checks.MIN_GBPS.items()))  # fmt: skip
    p.add_argument("--timeout", type=float, default=120.0, metavar="SECONDS",
                   help="deadline for the NIXL checks, which run in a child process (default 120)")  # fmt: skip
    p.add_argument("--json", dest="json_path", default="-", metavar="PATH",
                   help="where to write the full JSON report; default - (stdout)")  # fmt: skip
    p.add_argument("--termination-log", default=None, metavar="PATH",
                   help=f"where to write the compact JSON the operator reads from the pod status; default "
                        f"{KUBERNETES_TERMINATION_LOG} when it exists and is writable (as in a pod), '' = nowhere")  # fmt: skip
    p.add_argument("--strict", action="store_true", help="warnings fail too")
    return p


def run_checks(
    args: argparse.Namespace, env: dict[str, str], emit: Callable[[CheckResult], None] = lambda c: None
) -> list[CheckResult]:
    """Every check, in order; `emit` sees each result as it is made (init-container logs show progress)."""
    root: Path = args.root
    # EFA devices (and pinned memory for them) are needed by LIBFABRIC, and by any pod that requests them.
    efa_required = args.backend == "LIBFABRIC" or args.efa_devices > 0
    library_path = env.get("LD_LIBRARY_PATH", "") if args.library_path is None else args.library_path
    results: list[CheckResult] = []

    def add(*made: CheckResult) -> None:
        for c in made:
            results.append(c)
            emit(c)

    add(efa_devices.check(root, args.efa_devices, efa_required))
    uses_libfabric = args.backend == "LIBFABRIC"
    add(libfabric.check(root, uses_libfabric, library_path, env.get("PATH", ""), env.get("FI_PROVIDER_PATH", "")))
    add(hugepages.check(root, args.hugepages))
    add(memlock.check(root, efa_required, 2 * args.size))
    rdma = len(efa_devices.uverbs_devices(root))
    add(fabric_env.check(env, args.backend, root, efa_devices.efa_device_names(root), rdma))
    min_gbps = nixl_checks.MIN_GBPS[args.backend] if args.min_gbps is None else args.min_gbps
    add(*nixl_checks.check(args.backend, args.size, args.iterations, min_gbps, args.timeout))
    return results


def termination_log_path(option: str | None) -> str | None:
    if option is not None:
        return option or None
    # The kubelet creates the file in every container; outside a pod, do not create one in /dev.
    default = KUBERNETES_TERMINATION_LOG
    return default if os.path.isfile(default) and os.access(default, os.W_OK) else None


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    started = time.monotonic()
    width = max(len(n) for n in NAMES)
    promised = [f"backend {args.backend}"]
    if args.efa_devices:
        promised.append(f"{args.efa_devices} EFA devices")
    if args.hugepages:
        promised.append(f"hugepages-2Mi {to_quantity(args.hugepages)}")
    print(f"duplex preflight: {', '.join(promised)}; root {args.root}", file=sys.stderr, flush=True)

    def emit(c: CheckResult) -> None:
        print("\n".join(check_lines(c, width)), file=sys.stderr, flush=True)

    checks = run_checks(args, dict(os.environ), emit)
    report = Report(args.backend, checks, strict=args.strict, elapsed_s=time.monotonic() - started)
    print(summary_line(report), file=sys.stderr, flush=True)

    full = json.dumps(report.as_dict(), indent=2) + "\n"
    if args.json_path == "-":
        sys.stdout.write(full)
    else:
        Path(args.json_path).write_text(full)
    term = termination_log_path(args.termination_log)
    if term:
        try:
            Path(term).write_text(termination_message(report))
        except OSError as e:
            print(f"duplex preflight: could not write the termination log {term}: {e}", file=sys.stderr)
    return 0 if report.ok else 1

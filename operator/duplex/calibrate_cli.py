"""`duplex calibrate`: the recompute threshold this deployment or this machine measures, and what it came from.

    duplex calibrate --router URL    a running router's fit, off its admin port (kubectl port-forward deploy/NAME-router 9090)
    duplex calibrate --local         real CPU vLLM engines on this machine (the development install)

It prints the inputs of kvTransfer.recomputeThreshold: Auto (router/calibration.py) and the value Auto would apply
within the default bounds; --json prints the fit alone.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.request
from typing import Any

from duplex.api.spec import RecomputeCalibrationSpec


class NotTheAdminPort(OSError):
    pass


def router_fit(router_url: str, timeout: float = 30.0) -> dict[str, Any] | None:
    """The calibration a running router reports on its admin port's /ready (None until it has enough legs)."""
    try:
        with urllib.request.urlopen(router_url + "/ready", timeout=timeout) as resp:
            body = resp.read()
    except urllib.error.HTTPError as err:  # 503 while an engine is unhealthy: the same document
        body = err.read()
    ready = json.loads(body)
    if "calibration" not in ready:  # the API port's /ready says only {"ready": ...}
        raise NotTheAdminPort(f"{router_url} is a router's API port; give its admin port (9090 in a cluster)")
    fit = ready["calibration"]
    return fit if isinstance(fit, dict) else None


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="duplex calibrate", description=__doc__.split("\n\n")[0])
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--router", metavar="URL", help="a running router's admin port, e.g. http://localhost:9090")
    where.add_argument("--local", action="store_true", help="start real CPU vLLM engines here and measure them")
    p.add_argument("--conversations", type=int, default=16, help="--local: two-turn conversations to send")
    p.add_argument("--json", action="store_true", help="print the fit as JSON only")
    return p


def describe(fit: dict[str, Any], bounds: RecomputeCalibrationSpec | None = None) -> str:
    bounds = bounds or RecomputeCalibrationSpec()
    measured = fit.get("threshold")
    applied = bounds.max_tokens if measured is None else min(max(measured, bounds.min_tokens), bounds.max_tokens)
    pays = "never (a token reads slower than it computes)" if measured is None else f"from {measured} tokens"
    return "\n".join(
        [
            f"computed token   {fit['compute_seconds_per_token'] * 1e3:.4g} ms",
            f"read token       {fit['read_seconds_per_token'] * 1e3:.4g} ms",
            f"fixed read cost  {fit['replay_overhead_seconds'] * 1e3:.4g} ms",
            f"legs             {fit['recomputes']} recomputed, {fit['replays']} read back, the median "
            f"{fit.get('noise', 0.0):.0%} off the fit",
            f"reading pays     {pays}",
            f"Auto applies     {applied} tokens (within minTokens {bounds.min_tokens}, maxTokens {bounds.max_tokens})",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.conversations < 4:
        print("duplex calibrate: --conversations must be at least 4", file=sys.stderr)
        return 2
    try:
        if args.local:
            try:
                from duplex_dev.calibrate import run_local
            except ImportError:
                print("duplex calibrate --local needs the development install (make setup)", file=sys.stderr)
                return 2
            fit = run_local(args.conversations, progress=lambda line: print(line, file=sys.stderr))
        else:
            fit = router_fit(args.router.rstrip("/"))
    except OSError as err:
        print(f"duplex calibrate: {err}", file=sys.stderr)
        return 1
    if fit is None or "compute_seconds_per_token" not in fit:
        legs = (fit or {}).get("legs") or {"recomputes": 0, "replays": 0}
        print(f"duplex calibrate: no fit yet from {legs['recomputes']} recomputed and {legs['replays']} read-back "
              "prefill legs: it needs more of each kind, of varying sizes, and a fit that holds", file=sys.stderr)  # fmt: skip
        return 1
    print(json.dumps(fit, indent=2, sort_keys=True) if args.json else describe(fit))
    return 0

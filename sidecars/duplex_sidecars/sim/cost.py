"""How long simulated work takes. Every term defaults to zero so tests and router benchmarks run at full speed."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CostModel:
    prefill_us_per_token: float = 0.0
    # Attention makes each new token cost more the longer its context: the sum over new tokens of their context.
    prefill_attention_us_per_token2: float = 0.0
    decode_us_per_token: float = 0.0
    transfer_gbps: float = 0.0  # 0 = transfers take no simulated time beyond the real NIXL copy

    def prefill_seconds(self, new_tokens: int, context_tokens: int) -> float:
        """Computing `new_tokens` on top of `context_tokens` already in KV."""
        if new_tokens <= 0:
            return 0.0
        attention_pairs = new_tokens * context_tokens + new_tokens * (new_tokens + 1) / 2
        return (self.prefill_us_per_token * new_tokens + self.prefill_attention_us_per_token2 * attention_pairs) / 1e6

    def decode_seconds(self, tokens: int = 1) -> float:
        return self.decode_us_per_token * tokens / 1e6

    def transfer_seconds(self, num_bytes: int) -> float:
        if self.transfer_gbps <= 0:
            return 0.0
        return num_bytes * 8 / (self.transfer_gbps * 1e9)

"""How long simulated work takes. Every term defaults to zero so tests and router benchmarks run at full speed.

A profile (`--cost-profile`) is a JSON file whose `cost` object holds these fields: bench/sim_cost_fit.py writes one
fitted to a real vLLM engine's TTFT benchmark. `scaled` runs the same model faster or slower in wall time.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class CostModel:
    prefill_us_per_token: float = 0.0
    # Attention makes each new token cost more the longer its context: the sum over new tokens of their context.
    prefill_attention_us_per_token2: float = 0.0
    decode_us_per_token: float = 0.0
    transfer_gbps: float = 0.0  # 0 = transfers take no simulated time beyond the real NIXL copy
    # The fixed part of prefill reading decode's blocks back (D->P), beside its transfer: on the CPU engines it was
    # ~0.1 s (scheduler steps around the parked request), while decode's own P->D reads showed none.
    read_back_latency_us: float = 0.0

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

    def read_seconds(self, num_bytes: int, read_back: bool) -> float:
        """One NIXL read of `num_bytes`; `read_back`: prefill reading decode's blocks, which has a fixed part."""
        return (self.read_back_latency_us / 1e6 if read_back else 0.0) + self.transfer_seconds(num_bytes)

    def scaled(self, time_scale: float) -> CostModel:
        """The same model with every duration multiplied by `time_scale` (bandwidth divided by it)."""
        if time_scale <= 0:
            raise ValueError("time scale must be positive")
        return CostModel(
            prefill_us_per_token=self.prefill_us_per_token * time_scale,
            prefill_attention_us_per_token2=self.prefill_attention_us_per_token2 * time_scale,
            decode_us_per_token=self.decode_us_per_token * time_scale,
            transfer_gbps=self.transfer_gbps / time_scale,
            read_back_latency_us=self.read_back_latency_us * time_scale,
        )

    def replace(self, **changes: float | None) -> CostModel:
        """This model with the given fields changed; None leaves a field as it is."""
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})


FIELDS = tuple(f.name for f in dataclasses.fields(CostModel))


def load_profile(path: str | Path) -> CostModel:
    """The `cost` object of a profile file, with a message naming the file and field when it is not one."""
    try:
        doc: Any = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"cost profile {path}: {e}") from e
    cost = doc.get("cost") if isinstance(doc, dict) else None
    if not isinstance(cost, dict):
        raise ValueError(f"cost profile {path}: no `cost` object")
    unknown = sorted(set(cost) - set(FIELDS))
    if unknown:
        raise ValueError(f"cost profile {path}: unknown fields {unknown} (known: {list(FIELDS)})")
    bad = [k for k, v in cost.items() if not isinstance(v, int | float) or isinstance(v, bool) or v < 0]
    if bad:
        raise ValueError(f"cost profile {path}: {bad} must be numbers >= 0")
    return CostModel(**{k: float(v) for k, v in cost.items()})

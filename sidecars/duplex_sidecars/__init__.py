"""Pod-side programs of duplex: the KV-aware router and the vLLM P-D engine simulator."""

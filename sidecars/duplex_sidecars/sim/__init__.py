"""A CPU-only simulator of a vLLM engine in a P-D pair (NixlConnector, bidirectional KV transfer).

It speaks vLLM's OpenAI HTTP protocol and `kv_transfer_params`, keeps KV blocks in a DRAM buffer registered with
NIXL, moves them between processes with real NIXL READs, and verifies every block it reads.
"""

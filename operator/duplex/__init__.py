"""duplex: a Kubernetes operator for prefill-decode disaggregated vLLM with bidirectional KV transfer."""

__version__ = "0.1.0"

"""duplex: a Kubernetes operator for prefill-decode disaggregated vLLM with bidirectional KV transfer."""

from importlib.metadata import version as _distribution_version

# pyproject.toml's `version` is the only place the version is written; everything else derives from it.
__version__ = _distribution_version("duplex")

# The image that runs `duplex router` (and the operator); hack/build-image.sh tags what it builds with this name.
IMAGE = f"ghcr.io/duplex-dev/duplex:{__version__}"

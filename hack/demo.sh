#!/usr/bin/env bash
# `make run`: the end-to-end demo (see hack/duplex_dev/demo.py). Extra arguments go to `duplex-dev demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/duplex-dev demo "$@"

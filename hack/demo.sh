#!/usr/bin/env bash
# `make run`: the end-to-end demo (see operator/duplex/demo.py). Extra arguments go to `duplex demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/duplex demo "$@"

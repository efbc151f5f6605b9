#!/usr/bin/env bash
# Installs vLLM in its own cached virtualenv (outside the repo) so tests/vllm can check every rendered engine command
# line against vLLM's own argument parser and config classes. Idempotent: a marker file makes reruns instant.
# Cold install: ~3 min and ~9 GB (torch comes from PyPI; only PyPI is reachable here).
set -euo pipefail
VLLM_VERSION=${VLLM_VERSION:-0.33.0}
CACHE=${DUPLEX_CACHE:-$HOME/.cache/duplex}
VENV="$CACHE/vllm-$VLLM_VERSION"
MARKER="$VENV/.duplex-vllm-ok"
PY=${PYTHON:-python3}
t0=$(date +%s)
say() { printf '==> [setup-vllm +%ss] %s\n' "$(( $(date +%s) - t0 ))" "$*"; }

if [ -f "$MARKER" ] && "$VENV/bin/python" -c "import vllm" 2>/dev/null; then
  say "vLLM $VLLM_VERSION already installed in $VENV"
  echo "$VENV"
  exit 0
fi

mkdir -p "$CACHE"
if [ ! -x "$VENV/bin/python" ]; then
  say "creating virtualenv $VENV"
  "$PY" -m venv "$VENV"
fi
say "upgrading pip"
"$VENV/bin/pip" install -q --upgrade pip
say "installing vllm==$VLLM_VERSION (cold: a few minutes, ~9 GB)"
"$VENV/bin/pip" install -q --progress-bar off "vllm==$VLLM_VERSION"
say "verifying import (VLLM_TARGET_DEVICE=cpu)"
VLLM_TARGET_DEVICE=cpu "$VENV/bin/python" -c "import vllm, sys; print('vllm', vllm.__version__, 'python', sys.version.split()[0])"
date -u +%Y-%m-%dT%H:%M:%SZ > "$MARKER"
say "done: $(du -sh "$VENV" 2>/dev/null | cut -f1) in $VENV"
echo "$VENV"

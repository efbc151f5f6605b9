#!/usr/bin/env bash
# Installs vLLM in its own cached virtualenv (outside the repo) so tests/vllm can check every rendered engine command
# line against vLLM's own argument parser and config classes. Idempotent: a marker file makes reruns instant.
# Cold install: ~3 min and ~9 GB (torch comes from PyPI; only PyPI is reachable here).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/versions.sh"
CACHE=${DUPLEX_CACHE:-$HOME/.cache/duplex}
VENV="$CACHE/vllm-$VLLM_VERSION"
MARKER="$VENV/.duplex-vllm-ok"
PY=${PYTHON:-python3}
t0=$(date +%s)
say() { printf '==> [setup-vllm +%ss] %s\n' "$(( $(date +%s) - t0 ))" "$*" >&2; }

# The marker is written only after `import vllm` worked, so its presence is enough: reruns are instant.
if [ -f "$MARKER" ] && [ -x "$VENV/bin/python" ]; then
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
# pip -q is silent for minutes: a heartbeat says how far the download and unpack got.
(
  trap 'kill "$nap" 2>/dev/null; exit 0' TERM  # take the pending sleep along when stopped
  while :; do
    sleep 30 & nap=$!; wait "$nap"
    say "still installing: $(du -sh "$VENV" 2>/dev/null | cut -f1) so far"
  done
) &
heartbeat=$!
trap 'kill "$heartbeat" 2>/dev/null || true' EXIT
"$VENV/bin/pip" install -q --progress-bar off "vllm==$VLLM_VERSION"
kill "$heartbeat" 2>/dev/null || true
say "verifying import (VLLM_TARGET_DEVICE=cpu)"
VLLM_TARGET_DEVICE=cpu "$VENV/bin/python" -c "import vllm, sys; print('vllm', vllm.__version__, 'python', sys.version.split()[0])" >&2
date -u +%Y-%m-%dT%H:%M:%SZ > "$MARKER"
say "done: $(du -sh "$VENV" 2>/dev/null | cut -f1) in $VENV"
echo "$VENV"

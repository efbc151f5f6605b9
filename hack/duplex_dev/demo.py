"""`duplex-dev demo` (what `make run` runs): a local cluster with a real node beside the fake EFA fleet, duplex
installed with its Helm chart (the operator as a pod), examples/local.yaml applied, and its router and engine pods
running on the node; then a live multi-turn agentic chat through the router's Service, against the engine simulator
(the image's `vllm` command) moving KV blocks over real NIXL between the pods, with the tokens read back counted by
the engine pods. `--engines vllm` (`make run ENGINES=vllm`) places the same example on the fake fleet's CPU nodes
instead, and runs the chat on two real vLLM CPU engines as host processes, with the command lines the operator
rendered for it: vLLM's CPU build is 6.5 GB, an image of it is not worth building and importing on every fresh
machine."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from duplex.children.labels import ADMIN_PORT, HTTP_PORT
from duplex_dev import images, processes
from duplex_dev.chat import read_stream
from duplex_dev.cluster import ClusterError, LocalCluster
from duplex_dev.cluster.node_config import CHART_NODE_SELECTOR

ROOT = Path(__file__).resolve().parents[2]
NAMESPACE = "duplex-demo"
RELEASE, RELEASE_NAMESPACE = "duplex", "duplex-system"
# The simulated engines' costs: fitted to real vLLM CPU engines by bench/sim_cost_fit.py, run 10x faster.
SIM_COST_PROFILE = ROOT / "bench/results/sim-cost.json"
SIM_TIME_SCALE = 0.1
T0 = time.monotonic()


def say(text: str) -> None:
    print(f"[demo +{time.monotonic() - T0:6.1f}s] {text}", flush=True)


def kubectl(cluster: LocalCluster, *args: str, input: str | None = None, check: bool = True) -> str:
    proc = subprocess.run(
        [str(cluster.kubectl), f"--kubeconfig={cluster.kubeconfig}", *args],
        input=input,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if check and proc.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(args)}: {proc.stderr.strip()}")
    return proc.stdout


def load_image(cluster: LocalCluster) -> None:
    image = images.project_image()
    say(f"importing {image} (built by `make image`) into the node's containerd: there is no registry to pull from")
    cluster.import_image(images.archive(image))
    say(f"importing {images.REDIS_IMAGE} too, for examples/local-redis.yaml (hack/build-redis-image.sh)")
    cluster.import_image(images.archive(images.redis_image()))


def install_chart(cluster: LocalCluster) -> None:
    """`helm upgrade --install` of charts/duplex: the CRD, RBAC and the operator as a pod on the real node."""
    say(f"helm install {RELEASE} charts/duplex -n {RELEASE_NAMESPACE} (the operator runs as a pod on the real node)")
    argv = [
        str(cluster.bin_dir / "helm"), f"--kubeconfig={cluster.kubeconfig}", "upgrade", "--install", RELEASE,
        str(ROOT / "charts/duplex"), "-n", RELEASE_NAMESPACE, "--create-namespace", "--wait", "--timeout", "5m",
        "--set-string", CHART_NODE_SELECTOR,
    ]  # fmt: skip
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=400)
    if proc.returncode != 0:
        raise RuntimeError(f"helm install failed: {proc.stderr.strip() or proc.stdout.strip()}")
    say(f"operator pod Ready: {kubectl(cluster, '-n', RELEASE_NAMESPACE, 'get', 'pods', '-o', 'name').strip()}")


def apply_example(cluster: LocalCluster, doc: dict[str, Any], source: Path) -> str:
    say(f"applying {source.relative_to(ROOT)} in namespace {NAMESPACE}")
    kubectl(cluster, "create", "namespace", NAMESPACE, check=False)
    kubectl(
        cluster, "-n", NAMESPACE, "create", "secret", "generic", "hf-token", "--from-literal=token=demo", check=False
    )
    kubectl(cluster, "-n", NAMESPACE, "apply", "-f", "-", input=yaml.safe_dump(doc))
    return str(doc["metadata"]["name"])


def simulated_costs(doc: dict[str, Any]) -> dict[str, Any]:
    """The local example as the demo runs it: the engine simulator charges the compute time fitted to real vLLM CPU
    engines, 10x faster, verifies every block it reads, and prefill keeps no prefix cache of its own, so that every
    reused token is read back from decode (as the TTFT benchmark runs vLLM)."""
    cost = json.loads(SIM_COST_PROFILE.read_text())["cost"]
    args = [
        "--prefill-us-per-token", cost["prefill_us_per_token"],
        "--prefill-attention-us-per-token2", cost["prefill_attention_us_per_token2"],
        "--decode-us-per-token", cost["decode_us_per_token"], "--transfer-gbps", cost["transfer_gbps"],
        "--read-back-latency-ms", cost["read_back_latency_us"] / 1000, "--time-scale", SIM_TIME_SCALE,
        "--fail-on-corrupt",
    ]  # fmt: skip
    out = json.loads(json.dumps(doc))
    model = out["spec"]["model"]
    model["env"] = [
        *model.get("env", []),
        {"name": "DUPLEX_SIM_ARGS", "value": " ".join(f"{a:g}" if isinstance(a, float) else str(a) for a in args)},
    ]
    out["spec"]["prefill"]["enablePrefixCaching"] = False
    return out


FAKE_CPU_NODES = {"node.kubernetes.io/instance-type": "m7i.4xlarge"}  # tests/fixtures/fake-nodes.yaml


def on_fake_fleet(doc: dict[str, Any]) -> dict[str, Any]:
    """The example's pods placed on the fake fleet's CPU nodes: with `--engines vllm` the engines that serve are host
    processes running what the operator rendered, and the node stays free for them."""
    out = json.loads(json.dumps(doc))
    for part in ("prefill", "decode", "router"):
        out["spec"].setdefault(part, {})["nodeSelector"] = dict(FAKE_CPU_NODES)
    return out


def wait_condition(cluster: LocalCluster, serving: str, kind: str, timeout: float = 300.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        obj = json.loads(kubectl(cluster, "-n", NAMESPACE, "get", "dsv", serving, "-o", "json"))
        conds = {c["type"]: c for c in (obj.get("status") or {}).get("conditions") or []}
        cond = conds.get(kind, {})
        line = f"{kind}={cond.get('status', '?')} ({cond.get('message', 'no status yet')})"
        if line != last:
            say(line)
            last = line
        if cond.get("status") == "True":
            return obj
        time.sleep(1)
    raise RuntimeError(f"{serving}: {kind} not True after {timeout:.0f}s: {last}")


def show(cluster: LocalCluster, serving: str) -> None:
    print()
    print(kubectl(cluster, "-n", NAMESPACE, "get", "dsv,deploy,svc,pods", "-o", "wide"))
    obj = json.loads(kubectl(cluster, "-n", NAMESPACE, "get", "dsv", serving, "-o", "json"))
    print("status.effectiveKV:", json.dumps(obj["status"]["effectiveKV"]))
    for c in obj["status"]["conditions"]:
        print(f"  {c['type']:<23} {c['status']:<8} {c['reason']:<20} {c['message']}")
    print()


# ---------------------------------------------------------------- live multi-turn chat


def router_config_from_cluster(
    cluster: LocalCluster, serving: str, prefill: str, decode: str, model: str
) -> dict[str, Any]:
    """The router config the operator rendered, with EndpointSlice discovery swapped for the local engines."""
    cm = json.loads(kubectl(cluster, "-n", NAMESPACE, "get", "configmap", f"{serving}-router", "-o", "json"))
    config = json.loads(cm["data"]["router.json"])
    config["discovery"] = None
    config["prefill"], config["decode"] = [prefill], [decode]
    config["host"] = "127.0.0.1"
    config["admin_port"] = None  # /ready's detail (the canary below) on the one local port, not on a fixed 9090
    config["served_model_names"] = [model]
    # The engines run here, not in the cluster's pods: the canary's verdict is read off the router's /ready, not
    # reported to the operator (whose DisaggregationVerified counts canaries on its engine pods' IPs only).
    config["fabric"] = {**config["fabric"], "report": None}
    config["canary"] = {**config["canary"], "check_seconds": 1.0}
    return config


def wait_for_canary(url: str, timeout: float = 300.0) -> dict[str, Any]:
    """The router's first canary result (its two turns also open the connections and NIXL handshakes)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/ready", timeout=10) as resp:
                body = json.loads(resp.read())
        except urllib.error.HTTPError as err:
            body = json.loads(err.read() or b"{}")
        except (urllib.error.URLError, OSError, ValueError):
            body = {}
        if body.get("canary"):
            return dict(body["canary"])
        time.sleep(1.0)
    raise RuntimeError(f"the router's canary gave no result in {timeout:.0f}s")


class Engines:
    """Real vLLM CPU engines as host processes (`--engines vllm`), and what to read off them."""

    def __init__(self, kind: str, preset: str, example: Path):
        self.kind, self.preset, self.example = kind, preset, example
        self.prefill: Any = None
        self.decode: Any = None
        self.model = "sim"

    @contextlib.contextmanager
    def running(self) -> Iterator[Engines]:
        from duplex_dev.launch.vllm import vllm_pair

        say(
            f"starting real vLLM CPU engines ({self.preset} model) with the command lines the operator rendered "
            f"for {self.example.relative_to(ROOT)}, changed only by the host substitutions (60-90 s on 2 cores)"
        )
        # Prefill without its own prefix cache, as in the upstream blog's benchmark: every reused token is read.
        pair = vllm_pair(prefill_kw={"prefix_caching": False}, preset=self.preset, example=str(self.example))
        with pair as (self.prefill, self.decode):
            self.model = self.prefill.served_model_name
            for engine in (self.prefill, self.decode):
                changed = ", ".join(c.what for c in engine.changes)
                say(f"{engine.role} engine up; changed from the rendered Deployment (each with its reason in "
                    f"duplex_dev/launch/vllm.py): {changed}")  # fmt: skip
            yield self

    def read_back(self) -> float:
        """Prompt tokens whose KV prefill read from decode over NIXL."""
        return float(self.prefill.metric("vllm:prompt_tokens_by_source_total", source="external_kv_transfer"))


def tool_output(turn: int) -> str:
    words = [f"line{turn}_{i} value{(turn * 7919 + i) % 1000}" for i in range(400)]
    return "\n".join(" ".join(words[i : i + 8]) for i in range(0, len(words), 8))


async def chat(
    url: str, conversation_id: str, turns: int, fresh_each_turn: bool = False, model: str = "sim"
) -> list[dict[str, Any]]:
    """A multi-turn agentic chat through the router. `fresh_each_turn` gives every turn a new conversation id, so that
    nothing is ever found to reuse: the plain P-D baseline (a client without an id would get reuse keyed by its
    history)."""
    import aiohttp

    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent. Use the tools."}]
    out = []
    # No total limit: a turn on real CPU engines can take minutes on a busy machine; a stalled read still ends.
    timeout = aiohttp.ClientTimeout(total=None, sock_read=900)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        for turn in range(1, turns + 1):
            messages.append({"role": "user", "content": f"Step {turn}: read the next file and summarise it."})
            if turn > 1:
                call_id = f"call_{turn}"
                messages.append(
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": call_id,
                                "type": "function",
                                "function": {
                                    "name": "read_file",
                                    "arguments": json.dumps({"path": f"src/mod{turn}.py"}),
                                },
                            }
                        ],
                    }
                )
                messages.append({"role": "tool", "tool_call_id": call_id, "content": tool_output(turn)})
            body: dict[str, Any] = {
                "model": model,
                "messages": messages,
                "max_tokens": 24,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            body["conversation_id"] = f"{conversation_id}-turn-{turn}" if fresh_each_turn else conversation_id
            started = time.perf_counter()
            async with http.post(url + "/v1/chat/completions", json=body) as resp:
                resp.raise_for_status()
                streamed = await read_stream(resp, started)
            ttft, text, usage = streamed.first, streamed.text, streamed.usage
            messages.append({"role": "assistant", "content": text})
            out.append({"turn": turn, "ttft_ms": (ttft or 0) * 1000, "prompt_tokens": usage.get("prompt_tokens", 0)})
    return out


class EnginePods:
    """The serving's engine and router pods, read through their own /metrics: pod addresses route from the host
    into the node's network namespace."""

    def __init__(self, cluster: LocalCluster, serving: str):
        self.cluster, self.serving = cluster, serving

    def ips(self, role: str) -> list[str]:
        pods = json.loads(
            kubectl(self.cluster, "-n", NAMESPACE, "get", "pods", "-l", f"duplex.dev/serving={self.serving},"
                    f"duplex.dev/role={role}", "-o", "json")
        )["items"]  # fmt: skip
        return [p["status"]["podIP"] for p in pods if p["status"].get("phase") == "Running"]

    def metric(self, role: str, port: int, name: str, **labels: str) -> float:
        return sum(
            processes.metric_sum(processes.scrape(f"http://{ip}:{port}/metrics"), name, **labels)
            for ip in self.ips(role)
        )

    def read_back(self) -> float:
        return self.metric("prefill", HTTP_PORT, "vllm:prompt_tokens_by_source_total", source="external_kv_transfer")

    def corrupt(self) -> float:
        return sum(self.metric(role, HTTP_PORT, "sim_corrupt_blocks_total") for role in ("prefill", "decode"))

    def router(self, name: str, **labels: str) -> float:
        return self.metric("router", ADMIN_PORT, name, **labels)


def report(results: dict[str, Any], turns: int, hits: float, below: float, threshold: int, engines: str) -> None:
    base, reuse = results["recompute"], results["duplex reuse"]
    print()
    print(f"{'turn':>4} {'prompt tokens':>13} {'TTFT recompute':>15} {'TTFT duplex':>12} {'saved':>7}")
    for b, r in zip(base, reuse, strict=False):
        saved = 1 - r["ttft_ms"] / b["ttft_ms"] if b["ttft_ms"] else 0.0
        print(f"{b['turn']:>4} {b['prompt_tokens']:>13} {b['ttft_ms']:>12.1f} ms {r['ttft_ms']:>9.1f} ms {saved:>6.0%}")
    print()
    say(
        f"router reuse hits: {hits:.0f} of {turns - 1} possible"
        + (f" ({below:.0f} shorter than the {threshold}-token recompute threshold, recomputed)" if below else "")
        + "; tokens prefill read back from decode over NIXL: "
        f"{results['duplex reuse read']:.0f} (recompute: {results['recompute read']:.0f}); {engines}"
    )
    if hits + below < turns - 1:
        raise RuntimeError(f"expected {turns - 1} reuse hits or below-threshold recomputes, got {hits + below:.0f}")


def run_chats(url: str, model: str, turns: int, read_back: Any) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for label, conv, fresh in (("recompute", "demo-recompute", True), ("duplex reuse", "demo-conversation", False)):
        before = read_back()
        results[label] = asyncio.run(chat(url, conv, turns, fresh, model=model))
        results[label + " read"] = read_back() - before
    return results


def cluster_chat(cluster: LocalCluster, serving: str, turns: int) -> None:
    """The chat through the router's Service, as a client in the cluster would send it."""
    svc = json.loads(kubectl(cluster, "-n", NAMESPACE, "get", "svc", f"{serving}-router", "-o", "json"))
    url = f"http://{svc['spec']['clusterIP']}:{svc['spec']['ports'][0]['port']}"
    obj = json.loads(kubectl(cluster, "-n", NAMESPACE, "get", "dsv", serving, "-o", "json"))
    model = obj["spec"]["model"].get("servedModelName") or obj["spec"]["model"]["name"]
    pods = EnginePods(cluster, serving)
    say(f"chatting through Service {NAMESPACE}/{serving}-router at {url} ({turns} turns, recompute then duplex)")
    results = run_chats(url, model, turns, pods.read_back)
    corrupt = pods.corrupt()
    threshold = int(obj["status"]["effectiveKV"]["recomputeThreshold"])
    report(
        results,
        turns,
        hits=pods.router("duplex_router_kv_reuse_hits_total"),
        below=pods.router("duplex_router_kv_reuse_misses_total", reason="below_threshold"),
        threshold=threshold,
        engines=f"corrupt blocks: {corrupt:.0f} (counted by the engine pods)",
    )
    if corrupt:
        raise RuntimeError("the simulator saw corrupt KV blocks")


def host_chat(cluster: LocalCluster, serving: str, turns: int, engines: Engines) -> None:
    """Real vLLM CPU engines as host processes, behind a router with the config the operator rendered."""
    from duplex_dev.launch.router import RouterProcess

    with engines.running():
        config = router_config_from_cluster(cluster, serving, engines.prefill.url, engines.decode.url, engines.model)
        # 2 shared cores: an engine busy with a prefill may answer /health slowly
        config["health_check"] = {**config.get("health_check", {}), "timeout_seconds": 20.0}
        say(
            f"router config from ConfigMap {NAMESPACE}/{serving}-router (TTL "
            f"{config['conversation']['ttl_seconds']:g}s < engines' {config['conversation']['engine_blocks_ttl_seconds']:g}s)"
        )
        with RouterProcess(config=config) as router:
            # The canary first: it verifies both directions, and opens the connections and NIXL handshakes, so that
            # turn 1 compares fairly.
            canary = wait_for_canary(router.url)
            say(f"canary ({'verified' if canary['ok'] else 'FAILED at ' + canary['step']}): {canary['message']}")
            if not canary["ok"]:
                raise RuntimeError("the router's canary failed: " + canary["message"])
            results = run_chats(router.url, engines.model, turns, engines.read_back)
            hits = router.metric("duplex_router_kv_reuse_hits_total")  # the canary's are counted apart
            # A history shorter than the recompute threshold is recomputed: cheaper than a read (the first turn's).
            below = router.metric("duplex_router_kv_reuse_misses_total", reason="below_threshold")
            threshold = config.get("reuse", {}).get("min_tokens", 0)
    report(results, turns, hits, below, threshold, engines="engines: real vLLM (CPU)")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="duplex-dev demo", description=__doc__)
    parser.add_argument(
        "--example", type=Path, default=ROOT / "examples/local.yaml", help="a CPU example (default: %(default)s)"
    )
    parser.add_argument("--turns", type=int, default=5, help="turns of the live chat")
    parser.add_argument("--down", action="store_true", help="stop the local cluster at the end")
    parser.add_argument(
        "--engines",
        choices=("sim", "vllm"),
        default="sim",
        help="engine pods running the simulator, or real vLLM CPU engines as host processes",
    )
    parser.add_argument(
        "--preset",
        default="bench",
        help="the project model the real engines serve (hack/make_model.py): bench makes prefill dominate turn costs",
    )
    args = parser.parse_args(argv)
    example = args.example.resolve()
    cluster = LocalCluster(real_node=True)
    try:
        say("bringing up the local cluster and its real node (builds or reuses the binaries)")
        cluster.up(build=True)
        load_image(cluster)
        install_chart(cluster)
        doc = yaml.safe_load(example.read_text())
        if args.engines == "vllm":
            doc = on_fake_fleet(doc)
        else:
            doc = simulated_costs(doc)
            say("the engines simulate the compute time fitted to real vLLM CPU engines "
                f"({SIM_COST_PROFILE.relative_to(ROOT)}), {1 / SIM_TIME_SCALE:g}x faster; prefill keeps no prefix "
                "cache of its own, so every reused token is read back from decode")  # fmt: skip
        serving = apply_example(cluster, doc, example)
        wait_condition(cluster, serving, "Ready")
        if args.engines == "sim":
            obj = wait_condition(cluster, serving, "DisaggregationVerified")
            verified = next(c for c in obj["status"]["conditions"] if c["type"] == "DisaggregationVerified")
            say(f"canary (verified): {verified['message']}")
        show(cluster, serving)
        if args.engines == "sim":
            cluster_chat(cluster, serving, args.turns)
        else:
            host_chat(cluster, serving, args.turns, Engines(args.engines, args.preset, example))
    except (ClusterError, RuntimeError, images.ImageMissing) as err:
        print(f"duplex-dev demo: {err}", file=sys.stderr)
        return 1
    finally:
        if args.down:
            cluster.down()
    if args.down:
        say("done. The local cluster is stopped.")
    else:
        say(
            f"done. The cluster is still up: export KUBECONFIG={cluster.kubeconfig}; "
            f"kubectl -n {NAMESPACE} get dsv,pods. Stop it with: .venv/bin/duplex-dev cluster down"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

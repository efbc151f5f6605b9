"""`duplex-dev demo` (what `make run` runs): local control plane with fake EFA nodes, the operator, the seed
DisaggregatedServing, then a live multi-turn agentic chat through the router the operator configured, against two
simulated engines that move KV blocks over real NIXL, or (`--engines vllm`, `make run ENGINES=vllm`) two real vLLM CPU
engines running the command lines the operator rendered for the seed."""

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

from duplex_dev.chat import read_stream
from duplex_dev.cluster import ClusterError, LocalCluster

ROOT = Path(__file__).resolve().parents[2]
NAMESPACE = "duplex-demo"
SERVING = "qwen3-32b"
OPERATOR_USER = "duplex-operator"
# The simulated engines' costs: fitted to real vLLM CPU engines by bench/sim_cost_fit.py, run 10x faster.
SIM_COST_PROFILE = ROOT / "bench/results/sim-cost.json"
SIM_TIME_SCALE = 0.1
SIM_COST = ["--cost-profile", str(SIM_COST_PROFILE), "--time-scale", str(SIM_TIME_SCALE)]
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


def install(cluster: LocalCluster) -> None:
    say("installing the CRD (crds/) and the operator's ClusterRole (charts/duplex/files/clusterrole.yaml)")
    kubectl(cluster, "apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds"))
    kubectl(cluster, "wait", "--for=condition=Established", "crd/disaggregatedservings.duplex.dev", "--timeout=60s")
    kubectl(cluster, "apply", "-f", str(ROOT / "charts/duplex/files/clusterrole.yaml"))
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "duplex-operator-demo"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "duplex-operator"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": OPERATOR_USER}],
    }  # fmt: skip
    kubectl(cluster, "apply", "-f", "-", input=yaml.safe_dump(binding))


def start_operator(cluster: LocalCluster) -> subprocess.Popen[bytes]:
    kubeconfig = cluster.kubeconfig_for_user(OPERATOR_USER)
    log_path = cluster.state_dir / "logs" / "operator.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    say(f"starting the operator as user {OPERATOR_USER} (the chart's ClusterRole only); log {log_path}")
    argv = [sys.executable, "-m", "duplex.cli", "operator", "--all-namespaces", "--kubeconfig", str(kubeconfig),
            "--metrics-port", "0", "--health-port", "0"]  # fmt: skip
    return subprocess.Popen(argv, stdout=open(log_path, "ab"), stderr=subprocess.STDOUT, start_new_session=True)


def apply_example(cluster: LocalCluster, example: Path) -> None:
    say(f"applying {example.relative_to(ROOT)} in namespace {NAMESPACE}")
    kubectl(cluster, "create", "namespace", NAMESPACE, check=False)
    kubectl(
        cluster, "-n", NAMESPACE, "create", "secret", "generic", "hf-token", "--from-literal=token=demo", check=False
    )
    kubectl(cluster, "-n", NAMESPACE, "apply", "-f", str(example))


def wait_ready(cluster: LocalCluster, timeout: float = 180.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        obj = json.loads(kubectl(cluster, "-n", NAMESPACE, "get", "dsv", SERVING, "-o", "json"))
        conds = {c["type"]: c for c in (obj.get("status") or {}).get("conditions") or []}
        ready = conds.get("Ready", {})
        line = f"Ready={ready.get('status', '?')} ({ready.get('message', 'no status yet')})"
        if line != last:
            say(line)
            last = line
        if ready.get("status") == "True":
            return obj
        time.sleep(1)
    raise RuntimeError(f"{SERVING} not Ready after {timeout:.0f}s: {last}")


def show(cluster: LocalCluster) -> None:
    print()
    print(kubectl(cluster, "-n", NAMESPACE, "get", "dsv,deploy,svc,pods", "-o", "wide"))
    obj = json.loads(kubectl(cluster, "-n", NAMESPACE, "get", "dsv", SERVING, "-o", "json"))
    print("status.effectiveKV:", json.dumps(obj["status"]["effectiveKV"]))
    for c in obj["status"]["conditions"]:
        print(f"  {c['type']:<23} {c['status']:<8} {c['reason']:<20} {c['message']}")
    print()


# ---------------------------------------------------------------- live multi-turn chat


def router_config_from_cluster(cluster: LocalCluster, prefill: str, decode: str, model: str) -> dict[str, Any]:
    """The router config the operator rendered, with EndpointSlice discovery swapped for the local engines."""
    cm = json.loads(kubectl(cluster, "-n", NAMESPACE, "get", "configmap", f"{SERVING}-router", "-o", "json"))
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
    """The prefill and decode engine of the live chat, and what to read off them."""

    def __init__(self, kind: str, preset: str):
        self.kind, self.preset = kind, preset
        self.prefill: Any = None
        self.decode: Any = None
        self.model = "sim"

    @contextlib.contextmanager
    def running(self) -> Iterator[Engines]:
        if self.kind == "sim":
            from duplex_dev.launch.sim import sim_pair

            say(
                "starting a simulated prefill and decode engine (real NIXL over UCX on loopback), with the costs "
                f"fitted to real vLLM CPU engines ({SIM_COST_PROFILE.relative_to(ROOT)}), {1 / SIM_TIME_SCALE:g}x "
                "faster"
            )
            sim_args = [*SIM_COST, "--fail-on-corrupt"]
            pair = sim_pair(
                prefill_args=[*sim_args, "--no-enable-prefix-caching", "--kv-load-failure-policy", "recompute"],
                decode_args=sim_args,
            )
        else:
            from duplex_dev.launch.vllm import vllm_pair

            say(
                f"starting real vLLM CPU engines ({self.preset} model) with the command lines the operator rendered "
                "for the seed, changed only by the CPU substitutions (60-90 s on 2 cores)"
            )
            # Prefill without its own prefix cache, as in the upstream blog's benchmark: every reused token is read.
            pair = vllm_pair(prefill_kw={"prefix_caching": False}, preset=self.preset)
        with pair as (self.prefill, self.decode):
            if self.kind == "vllm":
                self.model = self.prefill.served_model_name
                for engine in (self.prefill, self.decode):
                    changed = ", ".join(c.what for c in engine.changes)
                    say(f"{engine.role} engine up; changed from the rendered Deployment (each with its reason in "
                        f"duplex_dev/launch/vllm.py): {changed}")  # fmt: skip
            yield self

    def read_back(self) -> float:
        """Prompt tokens whose KV prefill read from decode over NIXL."""
        return float(self.prefill.metric("vllm:prompt_tokens_by_source_total", source="external_kv_transfer"))

    def corrupt(self) -> float:
        """Blocks a reader found wrong (the simulator verifies every block; vLLM cannot tell)."""
        if self.kind != "sim":
            return 0.0
        return float(self.prefill.metric("sim_corrupt_blocks_total") + self.decode.metric("sim_corrupt_blocks_total"))


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


def live_chat(cluster: LocalCluster, turns: int, engines: Engines) -> None:
    from duplex_dev.launch.router import RouterProcess

    with engines.running():
        config = router_config_from_cluster(cluster, engines.prefill.url, engines.decode.url, engines.model)
        if engines.kind == "vllm":  # 2 shared cores: an engine busy with a prefill may answer /health slowly
            config["health_check"] = {**config.get("health_check", {}), "timeout_seconds": 20.0}
        say(
            f"router config from ConfigMap {NAMESPACE}/{SERVING}-router (TTL "
            f"{config['conversation']['ttl_seconds']:g}s < engines' {config['conversation']['engine_blocks_ttl_seconds']:g}s)"
        )
        with RouterProcess(config=config) as router:
            # The canary first: it verifies both directions, and opens the connections and NIXL handshakes, so that
            # turn 1 compares fairly.
            canary = wait_for_canary(router.url)
            say(f"canary ({'verified' if canary['ok'] else 'FAILED at ' + canary['step']}): {canary['message']}")
            if not canary["ok"]:
                raise RuntimeError("the router's canary failed: " + canary["message"])
            results: dict[str, Any] = {}
            for label, conv, fresh in (
                ("recompute", "demo-recompute", True),
                ("duplex reuse", "demo-conversation", False),
            ):
                before = engines.read_back()
                results[label] = asyncio.run(chat(router.url, conv, turns, fresh, model=engines.model))
                results[label + " read"] = engines.read_back() - before
            corrupt = engines.corrupt()
            hits = router.metric("duplex_router_kv_reuse_hits_total")  # the canary's are counted apart
            # A history shorter than the recompute threshold is recomputed: cheaper than a read (the first turn's).
            below = router.metric("duplex_router_kv_reuse_misses_total", reason="below_threshold")
            threshold = config.get("reuse", {}).get("min_tokens", 0)
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
        f"{results['duplex reuse read']:.0f} (recompute: {results['recompute read']:.0f}); "
        + (f"corrupt blocks: {corrupt:.0f}" if engines.kind == "sim" else "engines: real vLLM (CPU)")
    )
    if corrupt:
        raise RuntimeError("the simulator saw corrupt KV blocks")
    if hits + below < turns - 1:
        raise RuntimeError(f"expected {turns - 1} reuse hits or below-threshold recomputes, got {hits + below:.0f}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="duplex-dev demo", description=__doc__)
    parser.add_argument("--example", type=Path, default=ROOT / "examples/seed.yaml")
    parser.add_argument("--turns", type=int, default=5, help="turns of the live chat")
    parser.add_argument("--down", action="store_true", help="stop the local cluster at the end")
    parser.add_argument(
        "--engines", choices=("sim", "vllm"), default="sim", help="simulated engines, or real vLLM CPU engines"
    )
    parser.add_argument(
        "--preset",
        default="bench",
        help="the project model the real engines serve (hack/make_model.py): bench makes prefill dominate turn costs",
    )
    args = parser.parse_args(argv)
    cluster = LocalCluster()
    operator: subprocess.Popen[bytes] | None = None
    try:
        say("bringing up the local control plane (builds or reuses the binaries)")
        cluster.up(build=True)
        install(cluster)
        operator = start_operator(cluster)
        apply_example(cluster, args.example.resolve())
        wait_ready(cluster)
        show(cluster)
        live_chat(cluster, args.turns, Engines(args.engines, args.preset))
    except (ClusterError, RuntimeError) as err:
        print(f"duplex-dev demo: {err}", file=sys.stderr)
        return 1
    finally:
        if operator is not None:
            operator.terminate()
            operator.wait(15)
        if args.down:
            cluster.down()
    if args.down:
        say("done. The local control plane is stopped.")
    else:
        say(
            f"done. The cluster is still up: export KUBECONFIG={cluster.kubeconfig}; "
            f"kubectl -n {NAMESPACE} get dsv. Stop it with: .venv/bin/duplex-dev cluster down"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Conversations through day-2 events on two real nodes: duplex's drains against the same events with them off (both
roles' `drain.deadlineSeconds: 0`: a deleted engine pod gets SIGTERM at once and a decode pod's blocks die with it, as
plain Deployments end pods today).

    python bench/lifecycle_bench.py            # 6 conversations: bench/results/lifecycle-<date>.{json,md}
    python bench/lifecycle_bench.py --quick    # 3 conversations; bench/results/tmp/ (ignored)

A local cluster with two real nodes (as the e2e tier), duplex installed by its chart, examples/local.yaml with two
decode pods, driven through the router's Service by agentic conversations: each turn resends the whole history,
then a tool's think time. During that load, one after another: a KV-compatible change (a decode env var: the decode
Deployment rolls), a KV-incompatible change (the block size: both roles roll as a new KV revision), a decode pod
deleted, the engines' node drained (`kubectl drain`: prefill and both decode pods evicted; the router runs on the
other node, moved there first), decode scaled 2 to 1. Per event: client requests that failed, follow-up turns that
reused decode's blocks and those that recomputed, and why (each answer's receipt, router/receipt.py: every
conversation is a tenant of its own, so its receipts name the miss reason), bindings lost with a pod (`endpoint_gone`
misses: a pod ended while a conversation was bound to it), the most recomputes one conversation had, and the seconds
until the pods the event removes are gone. See docs/benchmarks.md ("Lifecycle benchmark").
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import shlex
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = Path(BENCH).parent
sys.path.insert(0, BENCH)

import results_io
from slots import Slots

from duplex_dev import images
from duplex_dev.cluster import LocalCluster, tools
from duplex_dev.cluster.node_config import CHART_NODE_SELECTOR, node_name
from duplex_sidecars.router import receipt

SERVING = "local"
DECODE = f"duplex.dev/serving={SERVING},duplex.dev/role=decode"
PREFILL = f"duplex.dev/serving={SERVING},duplex.dev/role=prefill"
ROUTER = f"duplex.dev/serving={SERVING},duplex.dev/role=router"
ENGINES_NODE, SPARE_NODE = node_name(0), node_name(1)  # every pod starts on the first; the second takes a drain's
TOOL_OUTPUT = " ".join(f"row{i} value{i * 7 % 97}" for i in range(200))
SLOW_TURN_SECONDS = 10.0  # a turn this long is kept in the results with its timing, as a failed one is
VARIANTS = {"drain": None, "no drain": 0}  # both roles' drain.deadlineSeconds (None: the defaults)


def say(message: str) -> None:
    print(f"[lifecycle {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


@dataclass
class Cluster:
    local: LocalCluster

    def kubectl(self, *args: str, input: str | None = None, timeout: float = 300) -> str:
        argv = [str(self.local.kubectl), f"--kubeconfig={self.local.kubeconfig}", *args]
        proc = subprocess.run(argv, input=input, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)}: {proc.stderr.strip()}")
        return proc.stdout

    def json(self, *args: str) -> Any:
        return json.loads(self.kubectl(*args, "-o", "json"))

    def pods(self, ns: str, selector: str) -> list[dict[str, Any]]:
        return list(self.json("-n", ns, "get", "pods", "-l", selector)["items"])

    def ready(self, ns: str, selector: str) -> list[dict[str, Any]]:
        out = []
        for pod in self.pods(ns, selector):
            conds = {c["type"]: c["status"] for c in pod["status"].get("conditions", [])}
            if conds.get("Ready") == "True" and not pod["metadata"].get("deletionTimestamp"):
                out.append(pod)
        return out


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not reached in {timeout:.0f} s (last: {value!r})")
        time.sleep(interval)


# --- load -----------------------------------------------------------------------------------------------------------


@dataclass
class Turn:
    started: float
    ended: float
    ok: bool
    first: bool
    conversation: str
    error: str = ""
    kv: str = ""  # the receipt's verdict: hit:<tokens> or miss:<reason>


@dataclass
class Load:
    """Conversations in threads, each turn after the previous answer and a think time; a conversation restarts after
    `turns` turns so that histories stay short."""

    url: str
    model: str
    conversations: int
    think: tuple[float, float] = (0.5, 2.0)
    turns: int = 10
    log: list[Turn] = field(default_factory=list)
    _slots: Slots = field(default_factory=Slots)

    @property
    def _stop(self) -> threading.Event:
        return self._slots.stopping

    def start(self) -> None:
        self._slots.start(self.conversations, self._run)

    def stop(self) -> None:
        self._slots.stop()

    def _run(self, _slot: int, rng: random.Random) -> None:
        while not self._stop.is_set():
            cid = f"bench-{uuid.uuid4().hex[:10]}"
            messages: list[dict[str, Any]] = [{"role": "user", "content": "Summarise this. " + TOOL_OUTPUT}]
            for n in range(self.turns):
                if self._stop.is_set():
                    return
                body = {"model": self.model, "messages": messages, "max_tokens": 12, "conversation_id": cid}
                started = time.monotonic()
                answer, kv, error = self._post(body, cid)
                self.log.append(Turn(started, time.monotonic(), answer is not None, n == 0, cid, error, kv))
                if answer is None:
                    break  # a failed turn ends the conversation, as an agent would retry from scratch
                messages += [
                    {"role": "assistant", "content": answer},
                    {"role": "user", "content": f"tool result {n}: " + TOOL_OUTPUT[: 200 + 40 * n]},
                ]
                self._stop.wait(rng.uniform(*self.think))

    def _post(self, body: dict[str, Any], tenant: str) -> tuple[str | None, str, str]:
        """The reply's text (None when the turn failed), its receipt's verdict, the error."""
        headers = {"content-type": "application/json", "authorization": f"Bearer {tenant}"}
        req = urllib.request.Request(self.url, data=json.dumps(body).encode(), headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=120) as resp:
                kv = receipt.parse(resp.headers.get("Server-Timing", "")).kv
                return json.loads(resp.read())["choices"][0]["message"]["content"], kv, ""
        except (OSError, ValueError, KeyError) as exc:
            return None, "", f"{type(exc).__name__}: {exc}"[:200]


# --- one variant ------------------------------------------------------------------------------------------------


def serving_doc(deadline: int | None) -> dict[str, Any]:
    doc = yaml.safe_load((ROOT / "examples/local.yaml").read_text())
    doc["spec"]["decode"]["replicas"] = 2
    doc["spec"]["prefill"]["enablePrefixCaching"] = False  # every reused token is read back from decode
    if deadline is not None:
        for role in ("prefill", "decode"):
            doc["spec"][role]["drain"] = {"deadlineSeconds": deadline}
    return dict(doc)


def tally(turns: list[Turn]) -> dict[str, Any]:
    """What the receipts of these turns say: follow-ups reused or recomputed, and why."""
    follow_ups = [t for t in turns if t.ok and not t.first]
    reasons = [t.kv.partition(":")[2] or "?" for t in follow_ups if not t.kv.startswith("hit:")]
    per_conversation: dict[str, int] = {}
    for t in follow_ups:
        if not t.kv.startswith("hit:"):
            per_conversation[t.conversation] = per_conversation.get(t.conversation, 0) + 1
    return {
        "follow_ups": len(follow_ups),
        "reused": len(follow_ups) - len(reasons),
        "recomputed": len(reasons),
        "bindings_lost": reasons.count("endpoint_gone"),
        "miss_reasons": {r: reasons.count(r) for r in sorted(set(reasons))},
        "most_recomputes_in_a_conversation": max(per_conversation.values(), default=0),
    }


def measure(
    cluster: Cluster, ns: str, load: Load, name: str, act: Callable[[], set[str]], settle: float
) -> dict[str, Any]:
    """Run `act` (it returns the pods the event removes), wait until they are gone and the decode pods are back to
    Ready, then `settle` seconds of load; what the clients saw over that window."""
    mark = len(load.log)
    started = time.monotonic()
    leaving = act()
    say(f"{name}: {len(leaving)} pod(s) to go: {', '.join(sorted(leaving))}")
    gone_after = None
    deadline = started + 900
    while time.monotonic() < deadline:
        names = {p["metadata"]["name"] for p in cluster.pods(ns, DECODE)}
        if gone_after is None and not (leaving & names):
            gone_after = time.monotonic() - started
            say(f"{name}: removed pods gone after {gone_after:.1f} s")
        if gone_after is not None:
            break
        time.sleep(0.5)
    time.sleep(settle)  # load keeps running: the turns after the event are part of its window
    turns = load.log[mark:]
    if any(not t.ok or t.ended - t.started > SLOW_TURN_SECONDS for t in turns):
        router_warnings(cluster, ns, time.monotonic() - started)
    return {
        "event": name,
        "requests": len(turns),
        "failed": sum(1 for t in turns if not t.ok),
        "errors": sorted({t.error for t in turns if not t.ok})[:5],
        **tally(turns),
        "removed_pods_gone_s": gone_after,
        "slow_or_failed": [  # when each began after the event, how long it took, what it was told
            {
                "at_s": round(t.started - started, 1),
                "took_s": round(t.ended - t.started, 1),
                "kv": t.kv,
                "error": t.error,
            }
            for t in turns
            if not t.ok or t.ended - t.started > SLOW_TURN_SECONDS
        ][:50],
    }


def router_warnings(cluster: Cluster, ns: str, seconds: float) -> None:
    """What the routers logged over an event with a slow or failed turn: which leg, on which engine, failed how."""
    for pod in cluster.pods(ns, ROUTER):
        name = pod["metadata"]["name"]
        try:
            out = cluster.kubectl("-n", ns, "logs", name, f"--since={int(seconds) + 5}s")
        except RuntimeError as err:
            say(f"router {name}: no logs ({err})")
            continue
        lines = [line for line in out.splitlines() if " WARNING " in line or " ERROR " in line]
        say(f"router {name}: {len(lines)} warnings in the event's window" + "".join(f"\n  {x}" for x in lines[-40:]))


def router_to_spare_node(cluster: Cluster, ns: str) -> None:
    """Before the load starts: the router runs on the spare node, so that the node drain never takes it (a drained
    router loses its memory store, a router restart and not this event; run two routers with the Redis store to drain
    a router's node). Not under load: a client connecting in the instant the only router pod's address goes can wait
    on that dead address until its own timeout (seen: 2 of 6 conversations stuck 120 s), which a window would count."""
    (router,) = cluster.ready(ns, ROUTER)
    if router["spec"]["nodeName"] == SPARE_NODE:
        return
    cluster.kubectl("uncordon", SPARE_NODE)
    cluster.kubectl("cordon", ENGINES_NODE)
    cluster.kubectl("-n", ns, "delete", "pod", router["metadata"]["name"], "--wait=true")
    wait_for(
        lambda: [p for p in cluster.ready(ns, ROUTER) if p["spec"]["nodeName"] == SPARE_NODE],
        120,
        "the router on the spare node",
    )
    cluster.kubectl("uncordon", ENGINES_NODE)
    cluster.kubectl("cordon", SPARE_NODE)  # every event's new pods land on the engines' node, as a drain finds them


def run_variant(cluster: Cluster, variant: str, deadline: int | None, conversations: int, settle: float) -> Any:
    ns = "bench-" + variant.replace(" ", "-")
    cluster.kubectl("cordon", SPARE_NODE)  # the serving starts on one node, as a drain finds it
    cluster.kubectl("uncordon", ENGINES_NODE)
    cluster.kubectl("create", "namespace", ns)
    try:
        cluster.kubectl("-n", ns, "apply", "-f", "-", input=yaml.safe_dump(serving_doc(deadline)))
        wait_for(lambda: len(cluster.ready(ns, DECODE)) == 2 and cluster.ready(ns, ROUTER), 300, "serving ready")
        router_to_spare_node(cluster, ns)
        wait_for(lambda: _ready_condition(cluster, ns), 300, "Ready condition")
        svc = cluster.json("-n", ns, "get", "svc", f"{SERVING}-router")
        url = f"http://{svc['spec']['clusterIP']}:{svc['spec']['ports'][0]['port']}/v1/chat/completions"
        model = cluster.json("-n", ns, "get", "dsv", SERVING)["spec"]["model"]["servedModelName"]
        load = Load(url, model, conversations)
        load.start()
        time.sleep(settle)  # warm: every conversation past its first turns
        events = []

        def roll() -> set[str]:
            old = {p["metadata"]["name"] for p in cluster.pods(ns, DECODE)}
            patch = {"spec": {"decode": {"env": [{"name": "BENCH_ROLL", "value": uuid.uuid4().hex[:6]}]}}}
            cluster.kubectl("-n", ns, "patch", "dsv", SERVING, "--type=merge", "-p", json.dumps(patch))
            return old

        def incompatible() -> set[str]:
            """A block-size change: a new KV revision, rolled in lockstep with prefill."""
            old = {p["metadata"]["name"] for p in cluster.pods(ns, DECODE)}
            size = cluster.json("-n", ns, "get", "dsv", SERVING)["spec"]["model"]["blockSize"]
            patch = {"spec": {"model": {"blockSize": 64 if size == 32 else 32}}}
            cluster.kubectl("-n", ns, "patch", "dsv", SERVING, "--type=merge", "-p", json.dumps(patch))
            return old

        def delete() -> set[str]:
            victim = cluster.ready(ns, DECODE)[0]["metadata"]["name"]
            cluster.kubectl("-n", ns, "delete", "pod", victim, "--wait=false")
            return {victim}

        draining: list[subprocess.Popen[str]] = []

        def node_drain() -> set[str]:
            """`kubectl drain` evicts prefill and both decode pods from the engines' node."""
            leaving = {p["metadata"]["name"] for p in cluster.pods(ns, DECODE) if p["spec"]["nodeName"] == ENGINES_NODE}
            argv = [str(cluster.local.kubectl), f"--kubeconfig={cluster.local.kubeconfig}", "drain", ENGINES_NODE]
            argv += ["--ignore-daemonsets", "--delete-emptydir-data", "--timeout=900s"]
            draining.append(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
            return leaving

        def scale_in() -> set[str]:
            old = {p["metadata"]["name"] for p in cluster.pods(ns, DECODE)}
            patch = {"spec": {"decode": {"replicas": 1}}}
            cluster.kubectl("-n", ns, "patch", "dsv", SERVING, "--type=merge", "-p", json.dumps(patch))
            kept: set[str] = wait_for(lambda: _one_left(cluster, ns, old), 120, "the ReplicaSet choosing its victim")
            return old - kept

        for name, act in (
            ("KV-compatible change", roll),
            ("KV-incompatible change", incompatible),
            ("decode pod deleted", delete),
            ("node drained", node_drain),
            ("scale-in 2 to 1", scale_in),
        ):
            wait_for(lambda: len(cluster.ready(ns, DECODE)) == 2, 300, "two decode pods")
            if act is node_drain:
                cluster.kubectl("uncordon", SPARE_NODE)  # where the drained pods go
            events.append(measure(cluster, ns, load, name, act, settle))
            for proc in draining:  # the drain is done once the pods it evicted are gone
                out, _ = proc.communicate(timeout=900)
                events[-1]["drain_exit"] = proc.returncode
                cluster.kubectl("uncordon", ENGINES_NODE)
                if proc.returncode != 0:
                    say(f"kubectl drain failed: {out[-800:]}")
            draining.clear()
            say(f"{variant}: {events[-1]}")
        load.stop()
        return events
    finally:
        # The serving first, then the namespace in the background: the namespace controller looks again only after
        # the longest grace period of the pods it saw.
        cluster.kubectl("-n", ns, "delete", "dsv", SERVING, "--wait=true", timeout=300)
        wait_for(lambda: not cluster.pods(ns, "app.kubernetes.io/part-of=duplex"), 600, "the serving's pods gone")
        cluster.kubectl("delete", "namespace", ns, "--wait=false")


def _ready_condition(cluster: Cluster, ns: str) -> bool:
    conds = cluster.json("-n", ns, "get", "dsv", SERVING).get("status", {}).get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)


def _one_left(cluster: Cluster, ns: str, old: set[str]) -> set[str] | None:
    """The decode pod the scale-in keeps, once the other one is being deleted."""
    live = [p for p in cluster.pods(ns, DECODE) if not p["metadata"].get("deletionTimestamp")]
    return {p["metadata"]["name"] for p in live} if len(live) == 1 else None


# --- report -----------------------------------------------------------------------------------------------------


def markdown(results: dict[str, Any]) -> str:
    lines = [
        f"# Lifecycle benchmark, {results['date']}",
        "",
        f"`{results['command']}` (duplex {results['commit']}): {results['conversations']} agentic conversations "
        f"through the router's Service on the local cluster's two real nodes, examples/local.yaml with two decode pods "
        f"(simulated engines, real NIXL over UCX), think time 0.5-2 s, {results['settle_s']:g} s of load after each "
        "event. `no drain` is the same serving with both roles' `drain.deadlineSeconds: 0`.",
        "",
        "| event | variant | requests | failed | follow-ups | reused | recomputed (why) | most in one conversation "
        "| bindings lost | removed pods gone |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    by_event: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for variant, events in results["variants"].items():
        for e in events:
            by_event.setdefault(e["event"], []).append((variant, e))
    for event, rows in by_event.items():
        for variant, e in rows:
            share = f" ({e['reused'] / e['follow_ups']:.0%})" if e["follow_ups"] else ""
            gone = f"{e['removed_pods_gone_s']:.1f} s" if e["removed_pods_gone_s"] is not None else "not in 900 s"
            why = ", ".join(f"{k} {v}" for k, v in e["miss_reasons"].items())
            lines.append(
                f"| {event} | {variant} | {e['requests']} | {e['failed']} | {e['follow_ups']} | "
                f"{e['reused']}{share} | {e['recomputed']}{f' ({why})' if why else ''} | "
                f"{e['most_recomputes_in_a_conversation']} | {e['bindings_lost']} | {gone} |"
            )
    lines += [
        "",
        "Follow-ups are turns after a conversation's first; `reused` ones read decode's blocks back, `recomputed` ones "
        "did not, with the miss reasons their receipts gave. `bindings lost`: turns whose blocks had gone with their "
        "pod (`endpoint_gone`).",
        "A KV-incompatible change (a block size) is rolled as a new KV revision in both variants: its target is one "
        "recompute per conversation going on (`revision_changed`, or `endpoint_gone` once the old pod has ended) and "
        "no failed request. `node drained`: `kubectl drain` of the node holding prefill and both decode pods (the "
        "router runs on the other node); with the drain, the only prefill pod keeps taking turns until its "
        "replacement is Ready.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 conversations, shorter windows; results in tmp/")
    parser.add_argument("--conversations", type=int, default=None)
    args = parser.parse_args(argv)
    conversations = args.conversations or (3 if args.quick else 6)
    settle = 10.0 if args.quick else 20.0
    image = images.project_image()
    state_dir = Path(tempfile.mkdtemp(prefix="duplex-lifecycle-"))
    local = LocalCluster(state_dir, bin_dir=tools.locate(None), real_nodes=2)
    try:
        say("starting a local cluster with two real nodes")
        local.up(timeout=300)
        local.import_image(images.archive(image))
        cluster = Cluster(local)
        helm = [str(local.bin_dir / "helm"), f"--kubeconfig={local.kubeconfig}"]
        subprocess.run(
            [*helm, "upgrade", "--install", "duplex", str(ROOT / "charts/duplex"), "-n", "duplex-system",
             "--create-namespace", "--wait", "--timeout", "5m", "--set-string", CHART_NODE_SELECTOR],
            check=True, capture_output=True, text=True,
        )  # fmt: skip
        variants = {}
        for variant, deadline in VARIANTS.items():
            say(f"variant {variant}")
            variants[variant] = run_variant(cluster, variant, deadline, conversations, settle)
    finally:
        local.down()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    results = {
        "date": dt.date.today().isoformat(),
        "command": " ".join(
            ["python bench/lifecycle_bench.py", shlex.join(argv if argv is not None else sys.argv[1:])]
        ).strip(),
        "commit": commit.stdout.strip(),
        "conversations": conversations,
        "settle_s": settle,
        "variants": variants,
    }
    where = os.path.join(results_io.RESULTS, "tmp" if args.quick else "", f"lifecycle-{results['date']}")
    results_io.write(where, results, markdown(results))
    print(markdown(results))
    say(f"wrote {where}.json and .md")
    return 0


if __name__ == "__main__":
    sys.exit(main())

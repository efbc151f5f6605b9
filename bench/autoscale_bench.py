"""Autoscaling on the real node: a load that steps up, holds and falls, served by fixed replicas, by duplex's planner
(`scaling.mode: Automatic` with a TTFT objective) and by a plain CPU-based HorizontalPodAutoscaler on each role
(`scaling.mode: External`), one after another, each in its own namespace.

    python bench/autoscale_bench.py            # bench/results/autoscale-<date>.{json,md,png}
    python bench/autoscale_bench.py --quick    # shorter phases; bench/results/tmp/ (ignored)

A local cluster with a real node, duplex installed by its chart, examples/local.yaml with simulated engines whose
prefill computes one leg at a time (so that one prefill pod saturates at the step's peak), driven through the
router's Service by agentic conversations that stream their answers: TTFT is the client's time to the first content
token. Replicas are polled from the Deployments. The HPA contender needs metrics.k8s.io: metrics-server runs on the
host (duplex_dev.launch.metrics_server). See docs/benchmarks.md ("Autoscaling benchmark").
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
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = Path(BENCH).parent
sys.path.insert(0, BENCH)

import autoscale_report
import procstat
import results_io
from lifecycle_bench import SERVING, TOOL_OUTPUT, Cluster, wait_for
from loadgen import Stream
from slots import Slots

from duplex_dev import images
from duplex_dev.cluster import LocalCluster, rest, tools
from duplex_dev.cluster.node_config import CHART_NODE_SELECTOR
from duplex_dev.launch.metrics_server import MetricsServer
from duplex_dev.processes import LaunchError
from duplex_sidecars.router import receipt

ROLES = ("prefill", "decode")
PARTS = "app.kubernetes.io/part-of=duplex"
ROUTER = f"duplex.dev/serving={SERVING},duplex.dev/role=router"
CONTENDERS = ("fixed", "planner", "hpa")

SLO_SECONDS = 1.0  # TTFT p90 objective: the planner's ttftP90Seconds and the attainment threshold
MAX_REPLICAS = 3  # per role, planner and HPA alike: 3 + 3 engine pods and a router fit the node's 2 cores
SCALE_DOWN_SECONDS = 30  # the planner's scaleDownSeconds and the HPA's scale-down stabilization window
HPA_CPU_UTILIZATION = 50  # percent of the engine container's CPU request (250m)
# The simulated engines: prefill charges 3 ms per computed prompt token (one leg at a time per pod, as vLLM's
# steps), decode 30 ms per generated token (legs in parallel). No prefix cache on prefill: every reused token is read
# back from decode, so a follow-up turn computes only what is new.
SIM_ARGS = "--prefill-us-per-token 3000 --decode-us-per-token 30000 --fail-on-corrupt"
SLOTS = {"prefill": 1, "decode": 2}  # maxNumSeqs: a prefill pod computes one leg at a time; decode's signal at 2
REPLY_TOKENS = 12
TURNS = 4  # a conversation restarts after this many turns, so that histories stay short


def say(message: str) -> None:
    print(f"[autoscale {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Profile:
    """Conversations going on over time: `base`, `peak` from `step_up` until `step_down`, `base` again until `end`."""

    base: int
    peak: int
    step_up: float
    step_down: float
    end: float
    tail_max: float  # then base load until the scaled roles are back at their minimum, this long at most

    def level(self, t: float) -> int:
        return self.peak if self.step_up <= t < self.step_down else self.base


FULL = Profile(base=2, peak=8, step_up=30, step_down=170, end=290, tail_max=60)
QUICK = Profile(base=2, peak=8, step_up=20, step_down=90, end=150, tail_max=60)


# --- load -----------------------------------------------------------------------------------------------------------


@dataclass
class Turn:
    started: float  # seconds since the run's start
    ended: float
    ok: bool
    first: bool
    ttft: float | None = None  # to the first content token of the stream
    prefill_ms: float | None = None  # Server-Timing: the prefill leg, queueing in the engine included
    kv: str = ""
    error: str = ""


@dataclass
class StepLoad:
    """One thread per conversation slot; slot i runs conversations while i < profile.level(t), each turn after the
    previous answer and a think time. A slot that goes idle finishes its turn in flight first."""

    url: str
    model: str
    profile: Profile
    think: tuple[float, float] = (0.5, 1.5)
    log: list[Turn] = field(default_factory=list)
    t0: float = 0.0
    _slots: Slots = field(default_factory=Slots)

    @property
    def _stop(self) -> threading.Event:
        return self._slots.stopping

    def now(self) -> float:
        return time.monotonic() - self.t0

    def start(self) -> None:
        self.t0 = time.monotonic()
        self._slots.start(self.profile.peak, self._run)

    def stop(self) -> None:
        self._slots.stop()

    def _active(self, slot: int) -> bool:
        return not self._stop.is_set() and slot < self.profile.level(self.now())

    def _run(self, slot: int, rng: random.Random) -> None:
        self._stop.wait(rng.uniform(*self.think))  # slots that start together do not arrive in lockstep
        while not self._stop.is_set():
            if not self._active(slot):
                self._stop.wait(0.2 + rng.uniform(0, 1.0))
                continue
            cid = f"autoscale-{uuid.uuid4().hex[:10]}"
            messages: list[dict[str, Any]] = [{"role": "user", "content": "Summarise this. " + TOOL_OUTPUT[:1200]}]
            for n in range(TURNS):
                if not self._active(slot):
                    break
                turn, answer = self._turn(messages, cid, n == 0)
                self.log.append(turn)
                if answer is None:
                    break  # a failed turn ends the conversation, as an agent would retry from scratch
                messages += [
                    {"role": "assistant", "content": answer},
                    {"role": "user", "content": f"tool result {n}: " + TOOL_OUTPUT[: 300 + 60 * n]},
                ]
                self._stop.wait(rng.uniform(*self.think))

    def _turn(self, messages: list[dict[str, Any]], cid: str, first: bool) -> tuple[Turn, str | None]:
        body = {
            "model": self.model,
            "messages": messages,
            "max_tokens": REPLY_TOKENS,
            "ignore_eos": True,
            "stream": True,
            "conversation_id": cid,
        }
        req = urllib.request.Request(
            self.url, data=json.dumps(body).encode(), headers={"content-type": "application/json"}
        )
        started = time.monotonic()
        turn = Turn(started - self.t0, 0.0, False, first)
        said = Stream()
        try:
            with urllib.request.urlopen(req, timeout=120) as resp:
                turn.prefill_ms, turn.kv = _receipt(resp.headers.get("Server-Timing", ""))
                for raw in resp:
                    if said.take(raw.strip()) and turn.ttft is None:
                        turn.ttft = time.monotonic() - started
                    if said.done:
                        break
            if not said.done:
                raise ValueError("the stream ended without [DONE]")
            turn.ok = turn.ttft is not None
        except (OSError, ValueError, KeyError, IndexError) as exc:
            turn.error = f"{type(exc).__name__}: {exc}"[:200]
        turn.ended = time.monotonic() - self.t0
        return turn, "".join(said.parts) if turn.ok else None


def _receipt(header: str) -> tuple[float | None, str]:
    """The prefill leg in milliseconds and the reuse verdict, from the answer's receipt (router/receipt.py)."""
    said = receipt.parse(header)
    return (said.prefill * 1000 if said.prefill is not None else None), said.kv


# --- what the cluster does ----------------------------------------------------------------------------------------


@dataclass
class Poller:
    """Each role's Deployment (spec and ready replicas) and the planner's status every second; the HPAs' every five."""

    api: rest.APIClient
    ns: str
    load: StepLoad
    contender: str
    samples: list[dict[str, Any]] = field(default_factory=list)
    decisions: list[dict[str, Any]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def replicas(self) -> dict[str, tuple[int, int]]:
        """role -> (spec replicas, ready replicas)."""
        path = f"/apis/apps/v1/namespaces/{self.ns}/deployments?labelSelector=duplex.dev/serving={SERVING}"
        out = {}
        for d in self.api.call("GET", path).json().get("items", []):
            role = d["metadata"].get("labels", {}).get("duplex.dev/role")
            if role in ROLES:
                out[role] = (int(d["spec"].get("replicas", 0)), int(d.get("status", {}).get("readyReplicas", 0)))
        return out

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            try:
                at = self.load.now()
                sample: dict[str, Any] = {"t": round(at, 2), "conversations": self.load.profile.level(at)}
                for role, (spec, ready) in self.replicas().items():
                    sample[role], sample[f"{role}_ready"] = spec, ready
                self.samples.append(sample)
                if self.contender == "planner" or n % 5 == 0:
                    self._decision(at)
            except (OSError, ValueError) as exc:
                say(f"{self.contender}: poll failed: {exc}")
            n += 1
            self._stop.wait(1.0)

    def _decision(self, at: float) -> None:
        if self.contender == "planner":
            dsv = self.api.call(
                "GET", f"/apis/duplex.dev/v1alpha1/namespaces/{self.ns}/disaggregatedservings/{SERVING}"
            )
            status = (dsv.json() or {}).get("status", {}).get("autoscaling")
            if status and (not self.decisions or self.decisions[-1]["status"] != status):
                self.decisions.append({"t": round(at, 2), "status": status})
        elif self.contender == "hpa":
            hpas = self.api.call("GET", f"/apis/autoscaling/v2/namespaces/{self.ns}/horizontalpodautoscalers").json()
            for hpa in (hpas or {}).get("items", []):
                status = hpa.get("status", {})
                cpu = [m["resource"]["current"] for m in status.get("currentMetrics") or [] if m.get("resource")]
                self.decisions.append(
                    {
                        "t": round(at, 2),
                        "hpa": hpa["metadata"]["name"],
                        "cpu": cpu[0] if cpu else None,
                        "desired": status.get("desiredReplicas"),
                    }
                )


# --- one contender --------------------------------------------------------------------------------------------------


def serving_doc(contender: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((ROOT / "examples/local.yaml").read_text())
    spec = doc["spec"]
    spec["model"]["env"] = [{"name": "DUPLEX_SIM_ARGS", "value": SIM_ARGS}]
    spec["prefill"]["enablePrefixCaching"] = False
    mode = {"fixed": "Fixed", "planner": "Automatic", "hpa": "External"}[contender]
    for role in ROLES:
        spec[role]["maxNumSeqs"] = SLOTS[role]
        spec[role]["replicas"] = 1
        spec[role]["scaling"] = {"mode": mode, "minReplicas": 1, "maxReplicas": MAX_REPLICAS}
    if contender == "planner":
        spec["autoscaling"] = {
            "targetSaturation": 0.75,
            "ttftP90Seconds": SLO_SECONDS,
            "prefillPerDecode": {"min": 0.5, "max": 2},
            "scaleDownSeconds": SCALE_DOWN_SECONDS,
        }
    return doc


def hpa_doc(role: str) -> dict[str, Any]:
    name = f"{SERVING}-{role}"
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": name},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
            "minReplicas": 1,
            "maxReplicas": MAX_REPLICAS,
            "metrics": [
                {
                    "type": "Resource",
                    "resource": {
                        "name": "cpu",
                        "target": {"type": "Utilization", "averageUtilization": HPA_CPU_UTILIZATION},
                    },
                }
            ],
            "behavior": {"scaleDown": {"stabilizationWindowSeconds": SCALE_DOWN_SECONDS}},
        },
    }


def _role_ready(cluster: Cluster, ns: str, role: str) -> Callable[[], list[dict[str, Any]]]:
    return lambda: cluster.ready(ns, f"duplex.dev/serving={SERVING},duplex.dev/role={role}")


def _ready_condition(cluster: Cluster, ns: str) -> bool:
    conds = cluster.json("-n", ns, "get", "dsv", SERVING).get("status", {}).get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)


def _hpas_see_cpu(api: rest.APIClient, ns: str) -> bool:
    hpas = api.call("GET", f"/apis/autoscaling/v2/namespaces/{ns}/horizontalpodautoscalers").json()
    items = (hpas or {}).get("items", [])
    return len(items) == len(ROLES) and all((h.get("status") or {}).get("currentMetrics") for h in items)


def run_contender(cluster: Cluster, api: rest.APIClient, contender: str, profile: Profile) -> dict[str, Any]:
    ns = f"autoscale-{contender}"
    cluster.kubectl("create", "namespace", ns)
    try:
        cluster.kubectl("-n", ns, "apply", "-f", "-", input=yaml.safe_dump(serving_doc(contender)))
        for role in ROLES:
            wait_for(_role_ready(cluster, ns, role), 300, f"{contender}: {role} pod ready")
        wait_for(lambda: cluster.ready(ns, ROUTER), 300, f"{contender}: router ready")
        wait_for(lambda: _ready_condition(cluster, ns), 300, f"{contender}: Ready condition")
        if contender == "hpa":
            docs = "".join("---\n" + json.dumps(hpa_doc(role)) + "\n" for role in ROLES)
            cluster.kubectl("-n", ns, "apply", "-f", "-", input=docs)
            wait_for(lambda: _hpas_see_cpu(api, ns), 180, "hpa: both HPAs reading CPU from metrics.k8s.io", 2.0)
        svc = cluster.json("-n", ns, "get", "svc", f"{SERVING}-router")
        url = f"http://{svc['spec']['clusterIP']}:{svc['spec']['ports'][0]['port']}/v1/chat/completions"
        model = cluster.json("-n", ns, "get", "dsv", SERVING)["spec"]["model"]["servedModelName"]
        load = StepLoad(url, model, profile)
        poller = Poller(api, ns, load, contender)
        say(
            f"{contender}: {profile.base} conversations, {profile.peak} from {profile.step_up:g} to {profile.step_down:g} s"
        )
        load.start()
        poller.start()
        last = 0
        while load.now() < profile.end:
            time.sleep(1.0)
            if load.now() - last >= 30:
                last = int(load.now())
                sample = poller.samples[-1] if poller.samples else {}
                recent = [t for t in load.log if t.started >= last - 30 and t.ok and t.ttft is not None]
                p90 = autoscale_report.p90([t.ttft for t in recent if t.ttft is not None])
                say(
                    f"{contender} t={last}s: conversations {profile.level(last)}, prefill {sample.get('prefill')} "
                    f"decode {sample.get('decode')}, TTFT p90 {p90 if p90 is None else round(p90, 2)} s over "
                    f"{len(recent)} turns, failed so far {sum(1 for t in load.log if not t.ok)}"
                )
        tail = 0.0
        if contender != "fixed":  # base load goes on until both roles are back at their minimum, or tail_max
            tail = _back_down(poller, load, profile)
        load.stop()
        poller.stop()
        say(f"{contender}: {len(load.log)} turns, {sum(1 for t in load.log if not t.ok)} failed")
        try:
            events = scaling_events(cluster, ns, wall_t0=time.time() - load.now())
        except (RuntimeError, ValueError, KeyError) as exc:
            say(f"{contender}: no events: {exc}")
            events = []
        return {
            "namespace": ns,
            "serving": serving_doc(contender)["spec"],
            "hpa": [hpa_doc(r)["spec"] for r in ROLES] if contender == "hpa" else None,
            "tail_s": tail,
            "turns": [asdict(t) for t in load.log],
            "samples": poller.samples,
            "decisions": poller.decisions,
            "events": events,
        }
    finally:
        # The serving first, then the namespace in the background (as bench/lifecycle_bench.py).
        cluster.kubectl("-n", ns, "delete", "hpa", "--all", "--wait=false")
        cluster.kubectl("-n", ns, "delete", "dsv", SERVING, "--wait=true", timeout=300)
        wait_for(lambda: not cluster.pods(ns, PARTS), 600, "the serving's pods gone")
        cluster.kubectl("delete", "namespace", ns, "--wait=false")


SCALING_REASONS = (
    "Autoscaled",
    "AutoscaleDryRun",
    "ReplicasOverwritten",
    "SuccessfulRescale",
    "FailedGetResourceMetric",
)


def scaling_events(cluster: Cluster, ns: str, wall_t0: float) -> list[dict[str, Any]]:
    """The planner's and the HPAs' Events in the namespace, at seconds since the run's start."""
    out = []
    for e in cluster.json("-n", ns, "get", "events")["items"]:
        if e.get("reason") not in SCALING_REASONS:
            continue
        stamp = e.get("lastTimestamp") or e.get("eventTime") or ""
        try:
            at = dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() - wall_t0
        except ValueError:
            at = None
        out.append({"t": at, "reason": e["reason"], "count": e.get("count", 1), "message": e.get("message", "")})
    return sorted(out, key=lambda e: e["t"] if e["t"] is not None else -1)


def _back_down(poller: Poller, load: StepLoad, profile: Profile) -> float:
    started = load.now()
    while load.now() < profile.end + profile.tail_max:
        sample = poller.samples[-1] if poller.samples else {}
        if all(sample.get(role) == 1 for role in ROLES):
            break
        time.sleep(1.0)
    return round(load.now() - started, 1)


# --- main ---------------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shorter phases; results in bench/results/tmp/")
    parser.add_argument(
        "--contenders", default=",".join(CONTENDERS), help=f"comma-separated, in order (default {','.join(CONTENDERS)})"
    )
    args = parser.parse_args(argv)
    contenders = [c for c in args.contenders.split(",") if c]
    unknown = sorted(set(contenders) - set(CONTENDERS))
    if unknown:
        parser.error(f"unknown contenders {unknown}; known: {', '.join(CONTENDERS)}")
    profile = QUICK if args.quick else FULL
    started = dt.datetime.now(dt.UTC)
    load_before = os.getloadavg()[0]
    image = images.project_image()
    local = LocalCluster(Path(tempfile.mkdtemp(prefix="duplex-autoscale-")), bin_dir=tools.locate(None), real_node=True)
    runs: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    metrics_server: MetricsServer | None = None
    try:
        say(f"starting a local cluster with a real node in {local.state_dir}")
        local.up(timeout=300)
        local.import_image(images.archive(image))
        cluster = Cluster(local)
        pki = local.layout.pki
        api = rest.APIClient(local.server, pki.ca_cert, pki.admin_cert, pki.admin_key)
        helm = [str(local.bin_dir / "helm"), f"--kubeconfig={local.kubeconfig}"]
        subprocess.run(
            [*helm, "upgrade", "--install", "duplex", str(ROOT / "charts/duplex"), "-n", "duplex-system",
             "--create-namespace", "--wait", "--timeout", "5m", "--set-string", CHART_NODE_SELECTOR],
            check=True, capture_output=True, text=True,
        )  # fmt: skip
        if "hpa" in contenders:
            try:
                say("starting metrics-server on the host (metrics.k8s.io for the HPA)")
                metrics_server = MetricsServer(local).start()
            except LaunchError as exc:
                skipped["hpa"] = f"metrics-server did not start: {str(exc).splitlines()[0]}"
                say(skipped["hpa"])
        for contender in contenders:
            if contender in skipped:
                continue
            say(f"contender {contender}")
            runs[contender] = run_contender(cluster, api, contender, profile)
    finally:
        if metrics_server is not None:
            metrics_server.stop()
        local.down()
    results = {
        "date": started.date().isoformat(),
        "started": started.isoformat(timespec="seconds"),
        "finished": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": " ".join(
            ["python bench/autoscale_bench.py", shlex.join(argv if argv is not None else sys.argv[1:])]
        ).strip(),
        "machine": procstat.machine_facts(str(ROOT)),
        "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "profile": asdict(profile),
        "settings": {
            "slo_s": SLO_SECONDS,
            "max_replicas": MAX_REPLICAS,
            "scale_down_s": SCALE_DOWN_SECONDS,
            "hpa_cpu_utilization": HPA_CPU_UTILIZATION,
            "sim_args": SIM_ARGS,
            "slots": SLOTS,
            "reply_tokens": REPLY_TOKENS,
            "turns_per_conversation": TURNS,
        },
        "skipped": skipped,
        "contenders": runs,
    }
    autoscale_report.analyse(results)
    where = os.path.join(results_io.RESULTS, "tmp" if args.quick else "", f"autoscale-{results['date']}")
    markdown = autoscale_report.markdown(results, os.path.basename(where) + ".png")
    results_io.write(where, results, markdown)
    if autoscale_report.can_plot():
        autoscale_report.plot(results, where + ".png")
    else:
        say("matplotlib is missing (pip install -e '.[bench]'): no plot")
    print(markdown)
    say(f"wrote {where}.json, .md and .png")
    return 0


if __name__ == "__main__":
    sys.exit(main())

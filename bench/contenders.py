"""The three contenders and how each runs a turn: the floor (the load generator performs the prefill and decode legs
itself, with the same HTTP client, replaying decode's blocks the way the router would), duplex's router, and the vLLM
project's Rust router (`vllm-router` from PyPI). Also starting and stopping their processes."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

import aiohttp
from loadgen import JSON_HEADERS, Conversation, Outcome, read_reply
from prometheus_client.parser import text_string_to_metric_families

from duplex_dev.launch.router import RouterProcess
from duplex_dev.processes import LaunchError, Startup, answers, free_port
from duplex_sidecars import protocol
from duplex_sidecars.router.config_file import deep_merge

VLLM_ROUTER_VERSION = "0.1.17"
CHAT_PATH = "/v1/chat/completions"


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj).encode()


class Floor:
    """No router: the client runs both legs. With `reuse` it keeps decode's replayable params per conversation and
    replays them (the engine work behind duplex); without, every prefill leg carries the miss payload (the engine
    work behind a router without conversation reuse)."""

    pid: int | None = None

    def __init__(self, prefill_url: str, decode_url: str, reuse: bool = True):
        self.name = "floor" if reuse else "floor-recompute"
        self.reuse = reuse
        self.prefill_url = prefill_url + CHAT_PATH
        self.decode_url = decode_url + CHAT_PATH

    async def turn(self, session: aiohttp.ClientSession, conv: Conversation, stream: bool) -> Outcome:
        body = conv.body(stream)
        replay, conv.replay = conv.replay, None
        kv = protocol.replay_params(replay) if replay else protocol.miss_params()
        out = Outcome(False, time.perf_counter(), replayed=replay is not None)
        async with session.post(
            self.prefill_url, data=_dumps(protocol.prefill_leg_body(body, kv)), headers=JSON_HEADERS
        ) as resp:
            raw = await resp.read()
            if resp.status != 200:
                out.error = f"prefill HTTP {resp.status}: {raw[:200]!r}"
                return out
        params = json.loads(raw).get(protocol.KV_PARAMS_FIELD)
        async with session.post(
            self.decode_url, data=_dumps(protocol.decode_leg_body(body, params)), headers=JSON_HEADERS
        ) as resp:
            await read_reply(resp, stream, out)
        if out.ok and self.reuse:
            conv.replay = protocol.replayable_decode_params(out.kv)
        return out


class _HttpRouter:
    """A router process behind one URL: the client sends the turn with its conversation_id."""

    name = "router"
    url = ""

    async def turn(self, session: aiohttp.ClientSession, conv: Conversation, stream: bool) -> Outcome:
        body = conv.body(stream)
        body["conversation_id"] = conv.id
        out = Outcome(False, time.perf_counter())
        async with session.post(self.url + CHAT_PATH, data=_dumps(body), headers=JSON_HEADERS) as resp:
            await read_reply(resp, stream, out)
        return out


class DuplexRouter(_HttpRouter):
    name = "duplex"

    def __init__(
        self,
        prefill_url: str,
        decode_url: str,
        conversation_ttl: float,
        engine_blocks_ttl: float,
        name: str = "duplex",
        pythonpath: str | None = None,
        entry: list[str] | None = None,
        config: dict[str, Any] | None = None,
    ):
        """`pythonpath` runs another tree's router (an exported git revision) in place of this one; `entry` another
        way of starting it (uvicorn's front); `config` is laid over the router's config (a variant's)."""
        self.name = name
        config = deep_merge(
            {"conversation": {"ttl_seconds": conversation_ttl, "engine_blocks_ttl_seconds": engine_blocks_ttl}},
            config or {},
        )
        env = {"PYTHONPATH": pythonpath} if pythonpath else None
        self.process = RouterProcess(
            prefill=[prefill_url], decode=[decode_url], config=config, env=env, **({"entry": entry} if entry else {})
        )
        self.url = self.process.url
        self.metrics_url = self.url + "/metrics"

    @property
    def pid(self) -> int | None:
        return self.process.process.pid if self.process.process else None

    def start(self) -> None:
        self.process.start()

    def wait_ready(self) -> None:
        self.process.wait_ready(60)

    def stop(self) -> None:
        self.process.stop()  # its log stays only when it did not exit cleanly


class VllmRouter(_HttpRouter):
    """`vllm-router --vllm-pd-disaggregation --prefill URL --decode URL --host H --port P`, default policy, plus
    `--prometheus-host/--prometheus-port` so that its metrics server does not clash with anything."""

    name = "vllm-router"

    def __init__(self, prefill_url: str, decode_url: str, extra_args: list[str] | None = None):
        self.port = free_port()
        self.metrics_port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.metrics_url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        self.extra_args = list(extra_args or [])
        self.prefill_url, self.decode_url = prefill_url, decode_url
        fd, self.log_path = tempfile.mkstemp(prefix="vllm-router-", suffix=".log")
        os.close(fd)
        self.process: subprocess.Popen[bytes] | None = None

    @staticmethod
    def executable() -> list[str]:
        script = os.path.join(os.path.dirname(sys.executable), "vllm-router")
        return [script] if os.path.exists(script) else [sys.executable, "-m", "vllm_router.launch_router"]

    def command(self) -> list[str]:
        return [*self.executable(), "--vllm-pd-disaggregation",
                "--prefill", self.prefill_url, "--decode", self.decode_url,
                "--host", "127.0.0.1", "--port", str(self.port),
                "--prometheus-host", "127.0.0.1", "--prometheus-port", str(self.metrics_port),
                *self.extra_args]  # fmt: skip

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def start(self) -> None:
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float = 60.0) -> None:
        assert self.process is not None
        url = self.url + "/health"
        startup = Startup(f"vllm-router on {url}", lambda: answers(url), self.process.poll, self.log_path, timeout)
        try:
            startup.wait(interval=0.1)
        except LaunchError:
            self.stop()
            raise

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process is not None and self.process.returncode == 0:
            with contextlib.suppress(OSError):
                os.remove(self.log_path)  # keep the log only when something went wrong

    def log_tail(self, lines: int = 30) -> str:
        try:
            with open(self.log_path, "rb") as f:
                return b"\n".join(f.read().splitlines()[-lines:]).decode(errors="replace")
        except OSError:
            return ""


def ensure_vllm_router(install: bool) -> str:
    """The bench set-up step: vllm-router==0.1.17 in this virtualenv (the project's `bench` extra)."""
    from importlib import metadata

    try:
        found = metadata.version("vllm-router")
    except metadata.PackageNotFoundError:
        found = None
    if found == VLLM_ROUTER_VERSION:
        return found
    if not install:
        raise SystemExit(
            f"vllm-router=={VLLM_ROUTER_VERSION} is not installed (found {found}); "
            f"run: {sys.executable} -m pip install vllm-router=={VLLM_ROUTER_VERSION}"
        )
    print(f"setup: pip install vllm-router=={VLLM_ROUTER_VERSION} (found {found})", flush=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", f"vllm-router=={VLLM_ROUTER_VERSION}"], check=True)
    return VLLM_ROUTER_VERSION


async def scrape(session: aiohttp.ClientSession, url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """One Prometheus scrape as {(sample name, sorted labels): value}; empty when the endpoint does not answer."""
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=10)) as resp:
            text = (await resp.read()).decode()
    except (aiohttp.ClientError, OSError, TimeoutError):
        return {}
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def metric_sum(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    return sum(
        v
        for (n, lbls), v in samples.items()
        if n == name and all(dict(lbls).get(k) == want for k, want in labels.items())
    )

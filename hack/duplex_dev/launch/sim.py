"""Start and stop `duplex sim` engines as subprocesses on free loopback ports (for tests and benchmarks).

API:
    SimProcess(role, *extra_args, engine_id=None, model="sim", host="127.0.0.1", port=None,
               side_channel_port=None, startup_timeout=30.0, env=None, log_dir=None, keep_log=False)
        One engine. `extra_args` are further `duplex sim` flags, e.g. "--no-bidirectional",
        "--kv-load-failure-policy", "recompute". Ports left as None are picked with free_port().
        Attributes: role, host, port, side_channel_port, engine_id, model, url ("http://host:port"),
                    log_path, process (subprocess.Popen or None).
        start() -> self               spawn without waiting
        wait_ready(timeout=None)      block until GET /health is 200; raises SimStartError with the log tail if
                                      the process exits or the deadline (startup_timeout) passes
        await wait_ready_async(timeout=None)
        stop(timeout=10.0) -> int     SIGTERM, then SIGKILL after `timeout`; returns the exit code. The log file
                                      is deleted after a clean exit (code 0) unless keep_log is set
        log_tail(lines=40) -> str     the end of the engine's combined stdout/stderr
        metrics() -> list[(name, labels, value)]      one /metrics scrape, parsed
        metric(name, **labels) -> float               sum of the samples of `name` whose labels match
                                                      (e.g. metric("sim_nixl_reads_total"))
        Context managers: `with SimProcess(...) as p:` and `async with SimProcess(...) as p:` start, wait for
        health and stop. Auto-picked ports that turn out to be taken are re-picked (up to 3 attempts).

    sim_pair(prefill_args=(), decode_args=(), **kwargs) -> context manager yielding (prefill, decode)
        Starts a prefill and a decode engine in parallel and stops both on exit; kwargs go to both SimProcess.
    async_sim_pair(...) -> the same as an async context manager.

`free_port` (from `duplex_dev.processes`) picks ports. The engines run `python -m duplex.cli sim` with the current interpreter, so they use the same virtualenv.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

from duplex_dev import processes
from duplex_dev.launch.child import Child
from duplex_dev.processes import LaunchError, free_port


class SimStartError(LaunchError):
    pass


class SimProcess(Child):
    def __init__(
        self,
        role: str,
        *extra_args: str,
        engine_id: str | None = None,
        model: str = "sim",
        host: str = "127.0.0.1",
        port: int | None = None,
        side_channel_port: int | None = None,
        startup_timeout: float = 30.0,
        env: dict[str, str] | None = None,
        log_dir: str | None = None,
        keep_log: bool = False,
    ):
        self.role = role
        self.extra_args = list(extra_args)
        self.engine_id = engine_id or f"sim-{role}-{uuid.uuid4().hex[:8]}"
        self.model = model
        self.host = host
        self._auto_ports = port is None and side_channel_port is None
        self.port = port or free_port(host)
        self.side_channel_port = side_channel_port or free_port(host)
        self.startup_timeout = startup_timeout
        self.env = env
        fd, self.log_path = tempfile.mkstemp(prefix=f"duplex-sim-{role}-", suffix=".log", dir=log_dir)
        os.close(fd)
        self.keep_log = keep_log
        self.process: subprocess.Popen[bytes] | None = None
        self._startup: processes.Startup | None = None
        self._attempts = 0

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def command(self) -> list[str]:
        return [
            sys.executable, "-m", "duplex.cli", "sim",
            "--role", self.role,
            "--host", self.host,
            "--port", str(self.port),
            "--side-channel-port", str(self.side_channel_port),
            "--engine-id", self.engine_id,
            "--model", self.model,
            *self.extra_args,
        ]  # fmt: skip

    # -- lifecycle --------------------------------------------------------------------------------------------
    def start(self) -> SimProcess:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **(self.env or {})}
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, env=env)
        self._attempts += 1
        self._startup = self._startup_for(self.startup_timeout)
        return self

    def _startup_for(self, timeout: float) -> processes.Startup:
        assert self.process is not None, "start() first"
        url = f"{self.url}/health"
        return processes.Startup(
            f"duplex sim {self.role} on {url}",
            lambda: processes.answers(url),
            self.process.poll,
            self.log_path,
            timeout,
            SimStartError,
        )

    def _started_again(self) -> bool:
        """After a port clash, start once more on new ports."""
        if not self._lost_a_port():
            return False
        self.port, self.side_channel_port = free_port(self.host), free_port(self.host)
        self.start()
        return True

    def _lost_a_port(self) -> bool:
        """It exited because a port picked for it was taken meanwhile (free_port only knows it was free then)."""
        if self.process is None or self.process.poll() is None or not self._auto_ports or self._attempts >= 3:
            return False
        return "address already in use" in self.log_tail().lower()

    def stop(self, timeout: float = 10.0) -> int | None:
        code = processes.stop_child(self.process, timeout)
        if code == 0 and not self.keep_log:
            with contextlib.suppress(OSError):
                os.remove(self.log_path)
        return code


@contextlib.contextmanager
def sim_pair(
    prefill_args: Sequence[str] = (), decode_args: Sequence[str] = (), **kwargs: Any
) -> Iterator[tuple[SimProcess, SimProcess]]:
    prefill = SimProcess("prefill", *prefill_args, **kwargs)
    decode = SimProcess("decode", *decode_args, **kwargs)
    try:
        prefill.start(), decode.start()
        prefill.wait_ready(), decode.wait_ready()
        yield prefill, decode
    finally:
        prefill.stop(), decode.stop()


@contextlib.asynccontextmanager
async def async_sim_pair(
    prefill_args: Sequence[str] = (), decode_args: Sequence[str] = (), **kwargs: Any
) -> AsyncIterator[tuple[SimProcess, SimProcess]]:
    prefill = SimProcess("prefill", *prefill_args, **kwargs)
    decode = SimProcess("decode", *decode_args, **kwargs)
    try:
        prefill.start(), decode.start()
        await asyncio.gather(prefill.wait_ready_async(), decode.wait_ready_async())
        yield prefill, decode
    finally:
        await asyncio.gather(asyncio.to_thread(prefill.stop), asyncio.to_thread(decode.stop))

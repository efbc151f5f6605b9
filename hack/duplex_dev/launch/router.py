"""Start and stop `duplex router` processes, on free loopback
ports (for tests and benchmarks).

    RouterProcess(*args, prefill=[urls], decode=[urls], config=None | dict | path, host="127.0.0.1", port=None,
                  engine_key=DEV_ENGINE_KEY)
        The router sends `engine_key` to the engines (as the operator's router sends the Secret's key), so that real
        vLLM engines launched from the rendered env (launch/vllm.py) accept it; None sends no key. A config file
        given by path is used as it is.
        start() / wait_ready(timeout, path="/health") / stop(); `url`, `log_tail()`, `metric(name, **labels)`;
        also a (sync and async) context manager.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from typing import Any

from duplex_dev import processes
from duplex_dev.launch.child import Child
from duplex_dev.launch.engine_key import DEV_ENGINE_KEY, ROUTER_ENV
from duplex_dev.processes import free_port


class RouterProcess(Child):
    def __init__(
        self,
        *extra_args: str,
        prefill: Sequence[str] = (),
        decode: Sequence[str] = (),
        config: dict[str, Any] | str | None = None,
        host: str = "127.0.0.1",
        port: int | None = None,
        env: dict[str, str] | None = None,
        startup_timeout: float = 20.0,
        entry: list[str] | None = None,
        engine_key: str | None = DEV_ENGINE_KEY,
    ):
        """`entry`: how to start the router after `python` (default `-m duplex.cli router`)."""
        self.entry = entry or ["-m", "duplex.cli", "router"]
        self.host = host
        self.port = port or free_port(host)
        self.extra_args = list(extra_args)
        self.prefill = list(prefill)
        self.decode = list(decode)
        self.env = {**({ROUTER_ENV: engine_key} if engine_key else {}), **(env or {})}
        if engine_key and not isinstance(config, str):
            config = {"engine_api_key_env": ROUTER_ENV, **(config or {})}
        self.startup_timeout = startup_timeout
        fd, self.log_path = tempfile.mkstemp(prefix="duplex-router-", suffix=".log")
        os.close(fd)
        self.config_path: str | None = None
        self._own_config = isinstance(config, dict)
        if isinstance(config, dict):
            fd, self.config_path = tempfile.mkstemp(prefix="duplex-router-", suffix=".json")
            with os.fdopen(fd, "w") as f:
                json.dump(config, f)
        elif isinstance(config, str):
            self.config_path = config
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def command(self) -> list[str]:
        cmd = [sys.executable, *self.entry, "--host", self.host, "--port", str(self.port)]
        for url in self.prefill:
            cmd += ["--prefill", url]
        for url in self.decode:
            cmd += ["--decode", url]
        if self.config_path:
            cmd += ["--config", self.config_path]
        return cmd + self.extra_args

    def start(self) -> RouterProcess:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.env}
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, env=env)
        self._startup = self._startup_for(self.startup_timeout)
        return self

    def _startup_for(self, timeout: float, path: str = "/health") -> processes.Startup:
        assert self.process is not None, "start() first"
        url = self.url + path
        return processes.Startup(
            f"duplex router on {url}", lambda: processes.answers(url), self.process.poll, self.log_path, timeout
        )

    def wait_ready(self, timeout: float | None = None, path: str = "/health") -> RouterProcess:
        """Wait until GET `path` answers 200 (/ready: also until its engines are healthy); stop it if it does not."""
        if path != "/health":
            self._startup = self._startup_for(timeout or self.startup_timeout, path)
            timeout = None
        return super().wait_ready(timeout)

    def stop(self, timeout: float = 10.0) -> int | None:
        """Stop the router; its temporary files go with it, except the log of a router that did not exit cleanly."""
        code = processes.stop_child(self.process, timeout)
        if self._own_config and self.config_path:
            with contextlib.suppress(OSError):
                os.remove(self.config_path)
        if code == 0:
            with contextlib.suppress(OSError):
                os.remove(self.log_path)
        return code

"""A throwaway `redis-server` (no persistence, in a temp dir, on a free loopback port) for the Redis store's tests
and benchmarks. `RedisServer.available()` tells whether the binary is installed."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from typing import Any

from duplex_dev import processes
from duplex_dev.processes import LaunchError, free_port


class RedisServer:
    def __init__(self, port: int | None = None, host: str = "127.0.0.1"):
        self.host = host
        self.port = port or free_port(host)
        self.dir = tempfile.mkdtemp(prefix="duplex-redis-")
        self.log_path = os.path.join(self.dir, "redis.log")
        self.process: subprocess.Popen[bytes] | None = None

    @staticmethod
    def available() -> bool:
        return shutil.which("redis-server") is not None

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    def _ping(self) -> bool:
        try:
            with socket.create_connection((self.host, self.port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def start(self, timeout: float = 10.0) -> RedisServer:
        binary = shutil.which("redis-server")
        if binary is None:
            raise LaunchError("redis-server is not installed (apt-get install -y redis-server)")
        cmd = [
            binary,
            "--bind",
            self.host,
            "--port",
            str(self.port),
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            self.dir,
            "--logfile",
            self.log_path,
            "--protected-mode",
            "no",
        ]
        self.process = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        startup = processes.Startup(
            f"redis-server on {self.host}:{self.port}", self._ping, self.process.poll, self.log_path, timeout
        )
        try:
            startup.wait()
        except LaunchError:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        processes.stop_child(self.process, timeout=5)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *_: Any) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

"""Processes started by dev tooling (the local control plane, launchers of routers, engines and Redis for tests,
benchmarks and the demo): spawn detached with a log file, tell whether a recorded pid is still that process, wait
until a started one is ready, stop a whole process group or one child, read log tails, scrape /metrics, pick free
ports. Processes are only ever signalled by recorded id."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path


class LaunchError(RuntimeError):
    """A process the dev tooling started did not come up."""


_handed_out: set[int] = set()  # ports free_port gave out already

# Popen objects of the processes this interpreter started, so stopping one also reaps it (no zombies in pytest).
_children: dict[int, subprocess.Popen] = {}


@dataclass(frozen=True)
class ProcessRecord:
    """What a state file remembers about a started process. `start_ticks` guards against pid reuse."""

    pid: int
    start_ticks: int
    argv: list[str]
    log: str

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> ProcessRecord:
        return cls(
            pid=int(data["pid"]), start_ticks=int(data["start_ticks"]), argv=list(data["argv"]), log=str(data["log"])
        )


def _stat(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name (index 0 is the state), or None if there is no such pid."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return raw[raw.rindex(")") + 2 :].split()


def start_ticks(pid: int) -> int | None:
    fields = _stat(pid)
    return int(fields[19]) if fields else None


def _reap(pid: int) -> None:
    child = _children.get(pid)
    if child is not None:
        child.poll()  # collects an exited child's status, so it is not left a zombie


def is_alive(record: ProcessRecord) -> bool:
    """True when the recorded pid still runs and is the process we started (same start time, not a zombie)."""
    _reap(record.pid)
    fields = _stat(record.pid)
    if fields is None or fields[0] in ("Z", "X"):
        return False
    return int(fields[19]) == record.start_ticks


def exit_code(record: ProcessRecord) -> int | None:
    """The exit status of a process this interpreter started and that has exited; None otherwise."""
    child = _children.get(record.pid)
    return None if child is None else child.poll()


def spawn(
    argv: Sequence[str],
    log_path: Path,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    append_log: bool = False,
) -> ProcessRecord:
    """Start `argv` in a new session (its own process group) with stdout and stderr appended to `log_path`."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab" if append_log else "wb") as log, open(os.devnull, "rb") as devnull:
        proc = subprocess.Popen(
            list(argv),
            stdin=devnull,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=env,
            start_new_session=True,
            close_fds=True,
        )
    _children[proc.pid] = proc
    ticks = start_ticks(proc.pid)
    if ticks is None:  # exited already; keep a record the caller can report on
        ticks = -1
    return ProcessRecord(pid=proc.pid, start_ticks=ticks, argv=list(argv), log=str(log_path))


def answers(url: str, timeout: float = 1.0) -> bool:
    """True when GET `url` (a /health or /ready) answers 200; False while it is not up, fails or answers otherwise."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return bool(resp.status == 200)
    except OSError:  # refused, reset, timed out, or an HTTPError such as /ready's 503
        return False


@dataclass(frozen=True)
class Startup:
    """A started process on its way to ready: what to poll, how to tell that it exited instead, and by when. The one
    readiness wait of the launchers (routers, engines, Redis, the benchmarks' contenders)."""

    what: str  # names the process and what is polled, for the messages: "duplex router on http://...:PORT/health"
    ready: Callable[[], bool]
    exit_code: Callable[[], int | None]  # None while the process runs
    log_path: str | Path
    timeout: float
    error: type[Exception] = LaunchError
    started: float = field(default_factory=time.monotonic)

    def check(self) -> bool:
        """True once ready; raises `error` with the log's tail once the process has exited or the timeout has
        passed; False to look again."""
        code = self.exit_code()
        if code is not None:
            raise self.error(f"{self.what}: exited with code {code} before becoming ready; {self._log()}")
        if self.ready():
            return True
        if time.monotonic() > self.started + self.timeout:
            raise self.error(f"{self.what}: not ready after {self.timeout:g} s; {self._log()}")
        return False

    def wait(self, interval: float = 0.05) -> None:
        while not self.check():
            time.sleep(interval)

    def _log(self) -> str:
        return f"log {self.log_path}:\n{log_tail(self.log_path)}"


def _group_members(pgid: int) -> list[int]:
    members = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        fields = _stat(int(entry.name))
        if fields and fields[0] not in ("Z", "X") and int(fields[2]) == pgid:
            members.append(int(entry.name))
    return members


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def stop(record: ProcessRecord, grace: float = 10.0) -> bool:
    """SIGTERM the process group the record leads, SIGKILL what is left after `grace` seconds; True when none is left.

    The group is signalled only while its leader is verifiably the recorded process, or, once the leader is gone,
    while members of that group still exist (a pgid cannot be reused as a pid while its group lives)."""
    pgid = record.pid
    if is_alive(record):
        _signal_group(pgid, signal.SIGTERM)
    elif not _group_members(pgid):
        _reap(record.pid)
        return True
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        _reap(record.pid)
        if not is_alive(record) and not _group_members(pgid):
            return True
        time.sleep(0.1)
    if is_alive(record) or _group_members(pgid):
        _signal_group(pgid, signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        child = _children.get(record.pid)
        if child is not None:
            try:
                child.wait(timeout=0.1)
            except subprocess.TimeoutExpired:
                pass
        if not is_alive(record) and not _group_members(pgid):
            return True
        time.sleep(0.1)
    return False


def stop_child(proc: subprocess.Popen[bytes] | None, timeout: float = 10.0) -> int | None:
    """SIGTERM a child started with Popen, then SIGKILL after `timeout`; its exit code (None if never started)."""
    if proc is None:
        return None
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def log_tail(path: str | Path, lines: int = 30) -> str:
    """The last `lines` lines of a log file ('' when it does not exist)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            data = f.read().decode(errors="replace")
    except FileNotFoundError:
        return ""
    return "\n".join(data.splitlines()[-lines:])


Sample = tuple[str, dict[str, str], float]


def scrape(url: str, timeout: float = 5.0) -> list[Sample]:
    """One Prometheus scrape of `url` (a /metrics address), parsed into (name, labels, value) samples."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=timeout) as resp:
        text = resp.read().decode()
    return [(s.name, s.labels, s.value) for fam in text_string_to_metric_families(text) for s in fam.samples]


def metric_sum(samples: list[Sample], name: str, **labels: str) -> float:
    """Sum of the samples named `name` whose labels include `labels`."""
    return sum(v for n, lbls, v in samples if n == name and all(lbls.get(k) == want for k, want in labels.items()))


def _below_ephemeral() -> range:
    """Ports below the kernel's ephemeral range: no outgoing connection is ever given one as its source port."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    return range(max(1024, low - 12000), low)


def free_port(host: str = "127.0.0.1") -> int:
    """A currently free TCP port, never the same one twice in this process. It is taken from below the ephemeral
    range: a port the kernel hands out (bind to 0) can be taken as the source port of any outgoing connection
    between now and when the process it is meant for binds it (seen in CI: a vLLM engine's NIXL side channel, bound
    again after a restart, found its port taken by a connection to the dead engine)."""
    candidates = _below_ephemeral()
    for _ in range(200):
        port = random.choice(candidates)
        if port in _handed_out:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise RuntimeError(f"could not find a free port in {candidates.start}-{candidates.stop - 1}")

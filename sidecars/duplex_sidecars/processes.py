"""Helpers shared by the launchers of pod-side programs (tests, benchmarks, the demo): stop, log tails, metrics."""

from __future__ import annotations

import signal
import subprocess
import urllib.request

Sample = tuple[str, dict[str, str], float]


def stop(proc: subprocess.Popen[bytes] | None, timeout: float = 10.0) -> int | None:
    """SIGTERM, then SIGKILL after `timeout`; the exit code (None if never started)."""
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


def log_tail(path: str, lines: int = 40) -> str:
    try:
        with open(path, "rb") as f:
            return b"\n".join(f.read().splitlines()[-lines:]).decode(errors="replace")
    except OSError:
        return ""


def scrape(url: str, timeout: float = 5.0) -> list[Sample]:
    """One Prometheus scrape of `url` (a /metrics address), parsed into (name, labels, value) samples."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=timeout) as resp:
        text = resp.read().decode()
    return [(s.name, s.labels, s.value) for fam in text_string_to_metric_families(text) for s in fam.samples]


def metric_sum(samples: list[Sample], name: str, **labels: str) -> float:
    """Sum of the samples named `name` whose labels include `labels`."""
    return sum(v for n, lbls, v in samples if n == name and all(lbls.get(k) == want for k, want in labels.items()))

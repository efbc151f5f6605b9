"""The router serving from the image, with a prefill and a decode `duplex sim` from the same image: all three on a
read-only root filesystem as uid 65532, on the host's network. A two-turn conversation's second turn reuses decode's
KV, which prefill reads back over NIXL (UCX) and verifies block by block."""

from __future__ import annotations

import asyncio
import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from working_container import WorkingContainer

from duplex_dev import processes
from duplex_dev.chat import ChatClient, Conversation
from duplex_dev.processes import ProcessRecord, free_port

HOST = "127.0.0.1"
LONG = "Please summarise the following report in detail. " * 12  # well above the recompute threshold


@dataclass
class Served:
    name: str
    record: ProcessRecord
    url: str
    log: Path
    metrics_url: str = ""  # the router's admin port; the engines' own port

    def metric(self, name: str, **labels: str) -> float:
        return processes.metric_sum(processes.scrape(f"{self.metrics_url or self.url}/metrics"), name, **labels)


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _wait_until_answering(served: Served, path: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not _answers(served.url + path):
        if not processes.is_alive(served.record):
            pytest.fail(f"{served.name} exited; log {served.log}:\n{processes.log_tail(served.log)}", pytrace=False)
        if time.monotonic() > deadline:
            pytest.fail(f"{served.name}: no 200 from {path} in {timeout:.0f}s:\n{processes.log_tail(served.log)}")
        time.sleep(0.2)


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                stat = Path(f"/proc/{entry.name}/stat").read_text()
            except OSError:
                continue
            children.setdefault(int(stat[stat.rindex(")") + 2 :].split()[1]), []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _uids_of_pythons_under(pid: int) -> set[int]:
    uids = set()
    for child in _descendants(pid):
        try:
            if "python" in Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")[0].decode():
                status = Path(f"/proc/{child}/status").read_text()
                uids.add(int(next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1]))
        except OSError:
            continue
    return uids


@pytest.fixture(scope="module")
def deployment(
    read_only_container: WorkingContainer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Served]]:
    logs = tmp_path_factory.mktemp("serving")
    engines = {}
    for role in ("prefill", "decode"):
        port, side_channel = free_port(HOST), free_port(HOST)
        extra = ["--no-enable-prefix-caching"] if role == "prefill" else []  # every reused token is a NIXL read
        argv = ["duplex", "sim", "--role", role, "--host", HOST, "--port", str(port)]
        argv += ["--side-channel-port", str(side_channel), *extra]
        record = read_only_container.spawn(*argv, log=logs / f"{role}.log")
        engines[role] = Served(role, record, f"http://{HOST}:{port}", logs / f"{role}.log")
    port, admin = free_port(HOST), free_port(HOST)
    argv = ["duplex", "router", "--host", HOST, "--port", str(port), "--admin-port", str(admin)]
    argv += ["--prefill", engines["prefill"].url, "--decode", engines["decode"].url]
    record = read_only_container.spawn(*argv, log=logs / "router.log")
    router = Served("router", record, f"http://{HOST}:{port}", logs, f"http://{HOST}:{admin}")
    router.log = logs / "router.log"
    served = {**engines, "router": router}
    try:
        for engine in engines.values():
            _wait_until_answering(engine, "/health")
        _wait_until_answering(router, "/ready")  # both engines seen healthy
        yield served
    finally:
        for each in served.values():
            processes.stop(each.record)


def test_every_process_runs_as_the_unprivileged_user(deployment: dict[str, Served]):
    for served in deployment.values():
        assert _uids_of_pythons_under(served.record.pid) == {65532}, served.name


def test_second_turn_reuses_decodes_kv_over_nixl(deployment: dict[str, Served]):
    router, prefill = deployment["router"], deployment["prefill"]
    reads_before = prefill.metric("sim_nixl_reads_total")

    async def two_turns() -> None:
        async with ChatClient(router.url) as client:
            conversation = Conversation("image-tier")
            await client.turn(conversation, LONG, max_tokens=8)
            await client.turn(conversation, "And the conclusions?", max_tokens=8)

    asyncio.run(two_turns())
    assert router.metric("duplex_router_kv_reuse_hits_total") >= 1
    assert router.metric("duplex_router_kv_reused_tokens_total") > 0
    assert prefill.metric("sim_nixl_reads_total") > reads_before
    assert prefill.metric("vllm:prompt_tokens_by_source_total", source="external_kv_transfer") > 0
    assert sum(deployment[role].metric("sim_corrupt_blocks_total") for role in ("prefill", "decode")) == 0


def test_the_router_keeps_metrics_and_topology_on_its_admin_port(deployment: dict[str, Served]):
    router = deployment["router"]
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(router.url + "/metrics", timeout=5)
    assert refused.value.code == 404
    with urllib.request.urlopen(router.url + "/ready", timeout=5) as resp:
        assert json.loads(resp.read()) == {"ready": True}
    with urllib.request.urlopen(router.metrics_url + "/ready", timeout=5) as resp:
        assert deployment["prefill"].url in resp.read().decode()

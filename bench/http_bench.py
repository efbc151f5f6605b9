"""The HTTP layer alone: the router's own server (duplex_sidecars.http1.server) against uvicorn with httptools behind
the same contract (hack/duplex_dev/uvicorn_front.py), with the same handlers, driven by the same keep-alive client.

    python bench/http_bench.py [--rounds 7] [--requests 3000] [--clients 1,16] [--out STEM]

Each server runs in a process of its own (`--serve KIND PORT` below) and is measured by its CPU time (utime + stime
from /proc) per 1,000 requests and by the clients' latency, for a whole JSON answer and for a 33-chunk stream (the
shape of a streamed completion). Rounds interleave the two servers so that the machine's drift hits both; the
figures are medians over rounds. Results go to bench/results/http-<date>.{md,json}, headed by the command, commit
and machine.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from typing import Any

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
sys.path.insert(0, BENCH)

import procstat
import results_io

from duplex_dev.processes import free_port
from duplex_sidecars.http1.client import EngineClient

SERVERS = ("duplex", "uvicorn")
ANSWER = json.dumps({"id": "x", "choices": [{"index": 0, "message": {"content": "hello " * 20}}]}).encode()
CHUNK = b'data: {"choices":[{"index":0,"delta":{"content":" tok"}}]}\n\n'
STREAM_CHUNKS = 33


def serve(kind: str, port: int) -> None:
    """A server process: POST /json answers one JSON body, POST /stream a 33-chunk SSE stream."""
    from duplex_sidecars.event_loop import run_loop
    from duplex_sidecars.http1.server import FrontServer, Limits

    async def handler(request: Any) -> None:
        if request.path == "/stream":
            request.start(200, {"Content-Type": "text/event-stream"}, CHUNK)
            for _ in range(STREAM_CHUNKS - 2):
                request.write(CHUNK)
                await request.drain()
            request.end(b"data: [DONE]\n\n")
        else:
            request.respond(200, ANSWER)

    async def main() -> None:
        if kind == "duplex":
            server: Any = FrontServer(handler, Limits(lambda: 1 << 20), lambda s, m: b"{}")
        else:
            from duplex_dev.uvicorn_front import UvicornFront

            server = UvicornFront(handler, Limits(lambda: 1 << 20), lambda s, m: b"{}")
        await server.start("127.0.0.1", port)
        print("ready", flush=True)
        await asyncio.Event().wait()

    run_loop(main())


async def drive(port: int, path: str, clients: int, requests: int) -> list[float]:
    """`requests` POSTs over `clients` keep-alive connections; each one's latency to its last body byte."""
    client = EngineClient()
    base = f"http://127.0.0.1:{port}"
    latencies: list[float] = []
    per_client = max(1, requests // clients)

    async def one_client() -> None:
        for _ in range(per_client):
            started = time.perf_counter()
            resp = await client.post(base, path, b"{}", {"Content-Type": "application/json"}, 5.0)
            await resp.read()
            resp.release()
            latencies.append(time.perf_counter() - started)

    await asyncio.gather(*(one_client() for _ in range(clients)))
    await client.close()
    return latencies


def start(kind: str) -> tuple[subprocess.Popen[str], int]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "--serve", kind, str(port)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != "ready":
        raise RuntimeError(f"{kind} server did not start")
    return proc, port


def run(args: argparse.Namespace) -> dict[str, Any]:
    procs = {kind: start(kind) for kind in SERVERS}
    cells: list[dict[str, Any]] = []
    try:
        for _, port in procs.values():  # warm-up: imports, connections, caches
            asyncio.run(drive(port, "/json", 4, 400))
        for round_ in range(args.rounds):
            order = SERVERS if round_ % 2 == 0 else SERVERS[::-1]
            for path in ("/json", "/stream"):
                for clients in args.clients:
                    for kind in order:
                        proc, port = procs[kind]
                        cpu0 = procstat.cpu_seconds(proc.pid)
                        latencies = asyncio.run(drive(port, path, clients, args.requests))
                        cpu = procstat.cpu_seconds(proc.pid) - cpu0
                        cells.append(
                            {
                                "round": round_,
                                "server": kind,
                                "path": path,
                                "clients": clients,
                                "requests": len(latencies),
                                "cpu_per_1k_s": cpu / len(latencies) * 1000,
                                "p50_ms": statistics.median(latencies) * 1000,
                                "p99_ms": statistics.quantiles(latencies, n=100)[98] * 1000,
                            }
                        )
                        print(f"round {round_} {kind:8} {path:8} {clients:3} clients: "
                              f"{cells[-1]['cpu_per_1k_s']:.3f} s CPU/1k, p50 {cells[-1]['p50_ms']:.3f} ms",
                              flush=True)  # fmt: skip
    finally:
        for proc, _ in procs.values():
            proc.terminate()
            proc.wait(10)
    return {"cells": cells, "summary": summarize(cells)}


def summarize(cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    keys = sorted({(c["path"], c["clients"]) for c in cells})
    for path, clients in keys:
        row: dict[str, Any] = {"path": path, "clients": clients}
        for kind in SERVERS:
            mine = [c for c in cells if (c["path"], c["clients"], c["server"]) == (path, clients, kind)]
            row[kind] = {
                "cpu_per_1k_s": statistics.median(c["cpu_per_1k_s"] for c in mine),
                "p50_ms": statistics.median(c["p50_ms"] for c in mine),
                "p99_ms": statistics.median(c["p99_ms"] for c in mine),
            }
        row["cpu_ratio"] = row["uvicorn"]["cpu_per_1k_s"] / max(row["duplex"]["cpu_per_1k_s"], 1e-9)
        rows.append(row)
    return rows


def markdown(results: dict[str, Any]) -> str:
    meta = results["meta"]
    lines = [
        f"# HTTP layer: duplex's server against uvicorn ({meta['started_utc'][:10]})",
        "",
        f"Command: `{meta['command']}`  ",
        f"Commit: {meta['machine'].get('git_commit')}; machine: {meta['machine'].get('cpu_model')}, "
        f"{meta['machine'].get('nproc')} CPUs; load average at start {meta['loadavg_start']}",
        "",
        "Server CPU per 1,000 requests (utime + stime of the server process) and client latency, medians over "
        f"{meta['rounds']} interleaved rounds of {meta['requests']} requests per cell. `/json`: one whole answer; "
        f"`/stream`: {STREAM_CHUNKS} chunks.",
        "",
        "| path | clients | duplex CPU/1k | uvicorn CPU/1k | uvicorn / duplex | duplex p50 | uvicorn p50 | duplex p99 | uvicorn p99 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results["summary"]:
        d, u = r["duplex"], r["uvicorn"]
        lines.append(
            f"| {r['path']} | {r['clients']} | {d['cpu_per_1k_s']:.3f} s | {u['cpu_per_1k_s']:.3f} s | "
            f"{r['cpu_ratio']:.2f}x | {d['p50_ms']:.3f} ms | {u['p50_ms']:.3f} ms | {d['p99_ms']:.3f} ms | "
            f"{u['p99_ms']:.3f} ms |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--serve"]:
        serve(argv[1], int(argv[2]))
        return 0
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--requests", type=int, default=3000, help="requests per cell")
    p.add_argument("--clients", default="1,16", help="concurrent keep-alive clients, comma-separated")
    p.add_argument("--out", help="results path without extension (default bench/results/http-<date>)")
    args = p.parse_args(argv)
    args.clients = [int(c) for c in args.clients.split(",")]
    started = dt.datetime.now(dt.UTC)
    meta = {
        "command": shlex.join([".venv/bin/python", "bench/http_bench.py", *argv]),
        "started_utc": started.isoformat(timespec="seconds"),
        "machine": procstat.machine_facts(ROOT),
        "loadavg_start": os.getloadavg(),
        "rounds": args.rounds,
        "requests": args.requests,
    }
    results = {"meta": meta, **run(args)}
    meta["loadavg_end"] = os.getloadavg()
    text = markdown(results)
    results_io.write(args.out or os.path.join(BENCH, "results", f"http-{started.date().isoformat()}"), results, text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

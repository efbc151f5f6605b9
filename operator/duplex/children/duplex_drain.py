"""An engine pod's preStop hook: hold a decode pod until no conversation is bound to it any more, and a prefill pod
while it is the last one the routers can send turns to.

When a decode pod is deleted (rollout, scale-in, drain, eviction) the kubelet runs this before SIGTERM. The pod
still serves meanwhile; its EndpointSlice entry turns `terminating`, so the router stops binding new turns to it
but lets each bound conversation's next turn read its blocks once and bind elsewhere. This asks the router's admin
port (`GET /drain`) how many active bindings (stored within `--active` seconds: conversations still going; older
ones are taken as finished) and legs the pod still holds, and returns when both are 0, when the router cannot be
reached (nobody is left to read the blocks), or at `--deadline` (the serving's drain deadline; the pod's grace period
leaves vLLM time to shut down after it). For a prefill pod the router answers `held` 1 while no other prefill pod of
the revision new turns go to serves (it keeps taking turns as the last resort), 0 once one does.

A worker rank of a multi-node instance (`--leader-env`) serves nothing itself: its engine is its leader's, and the
leader needs every rank while it drains. It holds while the leader still answers /health, and lets go once the
leader's engine has stopped (or at `--deadline`, the leader's hook and shutdown together).

Standard library only: it runs in the engine image's Python, from the ConfigMap that also carries the engine guard.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

INTERVAL_SECONDS = 2.0
UNREACHABLE_TRIES = 5  # consecutive failed asks before the router counts as gone
SETTLE_SECONDS = 10.0  # how long to wait for the router to see the pod draining before counting anyway


def say(message: str) -> None:
    """Into the container's log: a hook's own output is not kept, so write to PID 1's stdout when allowed."""
    line = f"duplex drain: {message}\n"
    try:
        with open("/proc/1/fd/1", "a") as out:
            out.write(line)
    except OSError:
        sys.stdout.write(line)


def ask(
    router: str, endpoint: str, key: str | None, active: float | None = None, timeout: float = 3.0
) -> dict[str, Any] | None:
    query = {"endpoint": endpoint, **({"active": f"{active:g}"} if active is not None else {})}
    url = f"{router.rstrip('/')}/drain?{urllib.parse.urlencode(query)}"
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout) as resp:
            answer = json.loads(resp.read())
    except (OSError, ValueError) as exc:  # URLError and HTTPError are OSErrors
        say(f"asking {router}: {type(exc).__name__}: {exc}")
        return None
    return answer if isinstance(answer, dict) else None


def wait(
    router: str,
    endpoint: str,
    key: str | None,
    deadline_seconds: float,
    interval: float = INTERVAL_SECONDS,
    active: float | None = None,
    clock: Any = time.monotonic,
    sleep: Any = time.sleep,
) -> str:
    """Poll until the pod holds no active binding and no leg; returns why it stopped: released, unreachable or
    deadline. `active`: the seconds within which a stored binding counts (None: every live binding)."""
    start = clock()
    failures, settled = 0, False
    while clock() - start < deadline_seconds:
        state = ask(router, endpoint, key, active)
        if state is None:
            failures += 1
            if failures >= UNREACHABLE_TRIES:
                return "unreachable"
        else:
            failures = 0
            # Until the router sees the pod draining it may still bind a turn to it.
            settled = settled or bool(state.get("draining")) or clock() - start >= SETTLE_SECONDS
            holding = state.get("active" if active is not None else "held")
            if settled and holding == 0 and not state.get("inflight"):
                return "released"
        sleep(interval)
    return "deadline"


def leader_answers(url: str, timeout: float = 3.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return bool(resp.status == 200)
    except (OSError, ValueError):  # URLError, HTTPError (an engine that failed answers 5xx), a closed port
        return False


def hold_while_leader(
    url: str,
    deadline_seconds: float,
    interval: float = INTERVAL_SECONDS,
    clock: Any = time.monotonic,
    sleep: Any = time.sleep,
    answers: Any = leader_answers,
) -> str:
    """Poll the leader's `url` until it has failed UNREACHABLE_TRIES times in a row (leader gone) or the deadline."""
    start, failures = clock(), 0
    while clock() - start < deadline_seconds:
        failures = 0 if answers(url) else failures + 1
        if failures >= UNREACHABLE_TRIES:
            return "leader gone"
        sleep(interval)
    return "deadline"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--router", help="the router's admin URL (an engine pod serving HTTP)")
    parser.add_argument("--leader-env", help="a worker rank: the variable holding its leader's address")
    parser.add_argument("--port", type=int, default=8000, help="the engine's HTTP port")
    parser.add_argument("--deadline", type=float, required=True, help="seconds to hold the pod at most")
    parser.add_argument("--active", type=float, default=None, help="seconds within which a binding counts")
    parser.add_argument("--host-env", default="VLLM_NIXL_SIDE_CHANNEL_HOST", help="variable holding the pod IP")
    parser.add_argument("--key-env", default="VLLM_API_KEY", help="variable holding the engine key")
    args = parser.parse_args(argv)
    if not args.router and not args.leader_env:
        parser.error("--router or --leader-env is required")
    env = args.leader_env or args.host_env
    host = os.environ.get(env, "")
    if not host:
        say(f"{env} is not set: not waiting")
        return 0
    if args.leader_env:
        health = _url(host, args.port) + "/health"
        return _hold(
            f"this rank while its leader {health} answers",
            args.deadline,
            lambda: hold_while_leader(health, args.deadline),
        )
    endpoint = _url(host, args.port)
    until = "no active conversation is bound to it" if args.active is not None else "the routers let it go"
    key = os.environ.get(args.key_env) or None
    return _hold(
        f"{endpoint} until {until}",
        args.deadline,
        lambda: wait(args.router, endpoint, key, args.deadline, active=args.active),
    )


def _url(host: str, port: int) -> str:
    return f"http://{f'[{host}]' if ':' in host else host}:{port}"


def _hold(what: str, deadline: float, hold: Any) -> int:
    started = time.monotonic()
    say(f"holding {what} (at most {deadline:g} s)")
    why = hold()
    say(f"{why} after {time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

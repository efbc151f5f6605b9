"""DisaggregationVerified: the router proves, with the engines' own counters, that its prefill-decode path does what
the spec says. Whenever its set of healthy engines changes (a rollout, a scale-up) it sends itself a two-turn
conversation through its own request path (`pipeline.serve`), pinned to one prefill and one decode engine (every
engine in one pair at least), and checks each step against those engines' /metrics:

  prefill      turn 1 was computed on prefill              prefill: prompt_tokens_by_source{local_compute} moved
  p_to_d       decode read prefill's blocks (P->D)         decode: prompt_tokens_by_source{external_kv_transfer}
  retained     decode kept its blocks for the next turn    the router's own lookup replays them on turn 2
  d_to_p       prefill read decode's blocks back (D->P)    prefill: external_kv_transfer tokens and NIXL reads
  receipt      turn 2's receipt says so                    its Server-Timing says `hit` (router/receipt.py)

A step whose counter did not move failed; the verdict names it and what to check. Other traffic moves the same
counters, so a pass under load is evidence rather than proof, while a failure is always real. Turn 1 carries a
`cache_salt` (vLLM keeps salted blocks apart in its prefix cache), so that prefill's own cache cannot serve turn 2
and the D->P read has to happen. The conversation runs under a tenant no client can be (its name holds a NUL) and
its turns are counted in metrics of their own, not the router's. Its turns carry receipts even where clients' are
off, and the verdict keeps them: what a client would have been told, checked against what the engines counted.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import logging
import os
import time
from collections.abc import Callable
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from duplex_sidecars.router import jsonio, pipeline, receipt
from duplex_sidecars.router.config import CanaryConfig
from duplex_sidecars.router.endpoints import DECODE, PREFILL, Engine, EnginePool
from duplex_sidecars.router.errors import RouterError
from duplex_sidecars.router.metrics import RouterMetrics
from duplex_sidecars.router.periodic import Periodic
from duplex_sidecars.router.picker import Hints, Picker
from duplex_sidecars.router.store import MemoryStore
from duplex_sidecars.router.turn import parse_turn

log = logging.getLogger(__name__)

TENANT = "\0duplex-canary"  # client tenants are key file names, which cannot hold a NUL
PATH = "/v1/chat/completions"
CANARY_ENTRIES = 4  # its own store: one conversation of two turns at a time
BY_SOURCE = "vllm:prompt_tokens_by_source_total"
READS = "vllm:nixl_xfer_time_seconds_count"
READ_BYTES = "vllm:nixl_bytes_transferred_sum"
_SENTENCE = "The canary checks that prefill and decode hand each other their KV blocks over the fabric."

# What to check when a step fails.
HINTS = {
    "prefill": "prefill computed nothing: is the prefill Service selecting prefill pods?",
    "p_to_d": "decode computed the prompt itself instead of reading prefill's blocks: check that both roles run "
    "the NixlConnector with the same model and block size, and that decode reaches prefill's side channel",
    "retained": "decode kept no blocks for the next turn: is bidirectional_kv_xfer on for decode?",
    "d_to_p": "prefill recomputed instead of reading decode's blocks: check bidirectional_kv_xfer on prefill, "
    "kv_recompute_threshold against the canary's prompt (router canary.prompt_words), and decode's block TTL",
    "receipt": "the engines read decode's blocks back but the receipt clients get says otherwise: a router bug, "
    "please report it with this verdict",
}


@dataclasses.dataclass(frozen=True)
class Counts:
    """One engine's counters that say where its prompt tokens' KV came from."""

    computed: float = 0.0
    external: float = 0.0
    reads: float = 0.0
    read_bytes: float = 0.0

    def __sub__(self, before: Counts) -> Counts:
        return Counts(*(getattr(self, f.name) - getattr(before, f.name) for f in dataclasses.fields(Counts)))


def counts_of(text: str) -> Counts:
    found = {"computed": 0.0, "external": 0.0, "reads": 0.0, "read_bytes": 0.0}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == BY_SOURCE and s.labels.get("source") == "local_compute":
                found["computed"] += s.value
            elif s.name == BY_SOURCE and s.labels.get("source") == "external_kv_transfer":
                found["external"] += s.value
            elif s.name == READS:
                found["reads"] += s.value
            elif s.name == READ_BYTES:
                found["read_bytes"] += s.value
    return Counts(**found)


class Pinned(Picker):
    """Always the one engine (retries included), while it is in the pool."""

    def __init__(self, url: str):
        super().__init__()
        self.url = url

    def pick(self, pool: EnginePool, hints: Hints | None = None) -> Engine | None:
        return pool.get(self.url)


class Exchange:
    """An in-memory client request: what `pipeline.serve` answers is kept in `status` and `out`."""

    method = "POST"
    path = PATH
    keep_alive = False

    def __init__(self, body: bytes, headers: dict[str, str]):
        self.body = body
        self._headers = {k.lower(): v for k, v in headers.items()}
        self.started = False
        self.status = 0
        self.out = bytearray()
        self.headers: dict[str, str] = {}  # the answer's (its receipt)

    def header(self, name: str) -> str | None:
        return self._headers.get(name.lower())

    def repeated(self, name: str) -> bool:
        return False

    def respond(self, status: int, body: bytes, content_type: str = "", headers: dict[str, str] | None = None) -> None:
        self.start(status, headers, body)

    def start(self, status: int, headers: dict[str, str] | None = None, first: bytes | bytearray = b"") -> None:
        self.started, self.status = True, status
        self.headers.update(headers or {})
        self.out += first

    def write(self, data: bytes | bytearray) -> None:
        self.out += data

    def end(self, data: bytes | bytearray = b"") -> None:
        self.out += data

    async def drain(self) -> None:
        return None


class StepFailed(Exception):
    def __init__(self, step: str, detail: str):
        super().__init__(f"{step}: {detail}")
        self.step, self.detail = step, detail


def pairs(prefills: list[str], decodes: list[str], limit: int) -> list[tuple[str, str]]:
    """Prefill-decode pairs in which every engine appears (up to `limit` pairs)."""
    if not prefills or not decodes:
        return []
    n = min(max(len(prefills), len(decodes)), limit)
    return [(prefills[i % len(prefills)], decodes[i % len(decodes)]) for i in range(n)]


def prompt(words: int) -> str:
    sentence = _SENTENCE.split()
    return " ".join(sentence[i % len(sentence)] for i in range(words))


class Canary:
    """Runs the canary when the healthy engines change (and again `retry_seconds` after a failure); `verdict()` is
    the latest result, as the fabric report carries it to the operator."""

    def __init__(
        self,
        config: CanaryConfig,
        deps: Callable[[], pipeline.Deps],
        session: Callable[[], aiohttp.ClientSession],
        headers: dict[str, str] | None = None,
    ):
        self.config = config
        self._deps = deps  # the router's current request-path dependencies (they change on a config reload)
        self._session = session
        self._headers = headers or {}
        self._metrics = RouterMetrics()  # the canary's turns stay out of the router's own metrics
        self.result: dict[str, Any] | None = None  # None: never ran
        self.runs = 0
        self._verified: tuple[tuple[str, ...], tuple[str, ...]] | None = None
        self._failed_at = 0.0
        self._periodic = Periodic("canary run", self._run_when_due, lambda: self.config.check_seconds, log)

    def verdict(self) -> dict[str, Any] | None:
        return self.result

    def _healthy(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        engines = self._deps().engines
        revision = engines.target_revision()  # during a rollout: the pairs of the revision turns go to

        def healthy(role: str) -> tuple[str, ...]:
            # A draining engine only while no other serves: a draining decode binds nothing then (pipeline.record),
            # so a canary on it would fail for a decode that is fine.
            pool = [e for e in engines.pool(role).engines.values() if e.healthy and revision in (None, e.revision)]
            return tuple(sorted(e.url for e in [e for e in pool if not e.draining] or pool))

        return healthy(PREFILL), healthy(DECODE)

    def due(self, now: float) -> bool:
        healthy = self._healthy()
        if not healthy[0] or not healthy[1]:
            return False
        if self.result is not None and not self.result["ok"]:
            return healthy != self._verified or now - self._failed_at >= self.config.retry_seconds
        return healthy != self._verified

    async def run(self) -> dict[str, Any]:
        """One canary over every pair of the engines healthy now; the first failing pair decides."""
        healthy = self._healthy()
        started = time.time()
        results = []
        for prefill_url, decode_url in pairs(list(healthy[0]), list(healthy[1]), self.config.max_pairs):
            result = await self.run_pair(prefill_url, decode_url)
            results.append(result)
            if not result["ok"]:
                break
        failed = [r for r in results if not r["ok"]]
        verdict = failed[0] if failed else {**results[0], "pairs": len(results)}
        at = datetime.datetime.fromtimestamp(started, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        verdict = {**verdict, "run": self.runs + 1, "at": at}
        self.runs += 1
        self._verified = healthy
        self.result = verdict
        if failed:
            self._failed_at = time.monotonic()
            log.warning(
                "canary failed on prefill %s, decode %s: %s", verdict["prefill"], verdict["decode"], verdict["message"]
            )
        else:
            log.info("canary passed on %d prefill-decode pairs: %s", len(results), verdict["message"])
        return verdict

    async def run_pair(self, prefill_url: str, decode_url: str) -> dict[str, Any]:
        out: dict[str, Any] = {"ok": False, "prefill": prefill_url, "decode": decode_url, "turns": []}
        try:
            out.update(await self._two_turns(prefill_url, decode_url, out["turns"]))
            out["ok"], out["step"] = True, "done"
        except StepFailed as failed:
            out["step"], out["message"] = failed.step, f"{failed.step}: {failed.detail}"
        except (RouterError, aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
            out["step"], out["message"] = "error", f"the canary could not run: {type(exc).__name__}: {exc}"
        return out

    async def _two_turns(self, prefill_url: str, decode_url: str, turns: list[dict[str, Any]]) -> dict[str, Any]:
        live = self._deps()
        # Its own metrics, its engines, and no router threshold: the read back must happen whatever its size (the
        # engines' own kv_recompute_threshold still applies, which canary.prompt_words is sized for). Its legs are
        # no samples for the calibration either: a salted turn 1 and a pinned pair are not the traffic's. Its entries
        # live in a store of its own: in the router's they would bind every decode engine it checks for a TTL, and
        # a draining decode pod waits for its bindings to end.
        config = live.config.model_copy(update={"reuse": live.config.reuse.model_copy(update={"min_tokens": 0})})
        deps = dataclasses.replace(
            live,
            config=config,
            pickers={PREFILL: Pinned(prefill_url), DECODE: Pinned(decode_url)},
            metrics=self._metrics,
            calibration=None,
            store=MemoryStore(CANARY_ENTRIES),
        )
        conversation = f"duplex-canary-{os.urandom(8).hex()}"
        model = self.config.model or next(iter(deps.config.served_model_names), None) or await self._model(prefill_url)
        messages = [{"role": "user", "content": prompt(self.config.prompt_words)}]

        p0, d0 = await self._counts(prefill_url), await self._counts(decode_url)
        _, reply = await self._turn(deps, model, messages, conversation, turns, salt=conversation)
        p1, d1 = await self._counts(prefill_url), await self._counts(decode_url)
        first_p, first_d = p1 - p0, d1 - d0
        if first_p.computed <= 0:
            raise StepFailed("prefill", HINTS["prefill"])
        if first_d.external <= 0 or first_d.reads <= 0:
            raise StepFailed("p_to_d", HINTS["p_to_d"])

        text = reply["choices"][0]["message"].get("content") or ""
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "Once more, briefly."}]
        ctx, _ = await self._turn(deps, model, messages, conversation, turns)
        second = await self._counts(prefill_url) - p1
        if not ctx.decision.hit:
            why = f"the router found nothing to replay ({ctx.decision.reason}): "
            raise StepFailed("retained", why + HINTS["retained"])
        if not ctx.replayed or second.external <= 0 or second.reads <= 0:
            raise StepFailed("d_to_p", HINTS["d_to_p"])
        r1, r2 = (receipt.parse(t["receipt"]) for t in turns)
        if not r2.hit or r2.tokens <= 0:
            raise StepFailed("receipt", f'turn 2 answered kv;desc="{r2.kv}": ' + HINTS["receipt"])
        return {
            "message": f"prefill computed {first_p.computed:.0f} tokens, decode read them "
            f"({first_d.read_bytes:.0f} bytes), prefill read {second.external:.0f} back ({second.read_bytes:.0f} "
            f"bytes); prefill legs {r1.prefill or 0:.3f} s, then {r2.prefill or 0:.3f} s with the read; "
            f"turn 2's receipt: hit:{r2.tokens}",
            "p_to_d_bytes": first_d.read_bytes,
            "d_to_p_bytes": second.read_bytes,
            "d_to_p_tokens": second.external,
        }

    async def _turn(
        self,
        deps: pipeline.Deps,
        model: str,
        messages: list[dict[str, Any]],
        conversation: str,
        turns: list[dict[str, Any]],
        salt: str | None = None,
    ) -> tuple[pipeline.Context, dict[str, Any]]:
        """One turn through the request path; its context and the client's answer."""
        cc = deps.config.conversation
        body: dict[str, Any] = {
            "model": model,
            "messages": messages,
            "max_tokens": self.config.max_tokens,
            "temperature": 0,
        }
        if cc.body_field:
            body[cc.body_field] = conversation
        exchange = Exchange(jsonio.dumps(body), {cc.header: conversation} if cc.header else {})
        turn = parse_turn(exchange, exchange.body, cc, deps.config.served_model_names, TENANT)
        if salt is not None:
            turn.body["cache_salt"] = salt  # after the scope was taken: turn 2 (unsalted) may still replay turn 1
        turn.receipts = True
        started = time.perf_counter()
        ctx = await asyncio.wait_for(pipeline.serve(deps, exchange, turn), self.config.turn_timeout_seconds)
        seconds = round(time.perf_counter() - started, 4)
        if exchange.status != 200:
            detail = bytes(exchange.out[:300]).decode(errors="replace")
            raise StepFailed("error", f"turn {len(turns) + 1} answered HTTP {exchange.status}: {detail}")
        said = exchange.headers.get("Server-Timing", "")
        turns.append({"seconds": seconds, "replayed": receipt.parse(said).hit, "receipt": said})
        answer, _ = jsonio.loads(bytes(exchange.out))
        return ctx, answer

    async def _counts(self, url: str) -> Counts:
        async with self._session().get(
            url + "/metrics", headers=self._headers, timeout=aiohttp.ClientTimeout(total=30)
        ) as resp:
            if resp.status != 200:
                raise StepFailed("error", f"{url}/metrics answered HTTP {resp.status}")
            return counts_of(await resp.text())

    async def _model(self, url: str) -> str:
        async with self._session().get(
            url + "/v1/models", headers=self._headers, timeout=aiohttp.ClientTimeout(total=30)
        ) as resp:
            data = (await resp.json()).get("data") or []
            if resp.status != 200 or not data:
                raise StepFailed("error", f"{url}/v1/models listed no model")
            return str(data[0]["id"])

    async def _run_when_due(self) -> None:
        if self.due(time.monotonic()):
            await self.run()

    def start(self) -> None:
        self._periodic.start()

    async def stop(self) -> None:
        await self._periodic.stop()

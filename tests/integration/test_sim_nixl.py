"""The simulator's P-D protocol end to end: real `duplex sim` processes moving KV blocks with NIXL over UCX.

The router's part is played by hand with the shapes from duplex_sidecars.protocol. A missing nixl package fails these
tests (in CI and locally): a skipped transport test would hide exactly the regressions it exists for.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from duplex_dev.launch.sim import SimProcess, SimStartError
from duplex_sidecars import protocol as pr
from duplex_sidecars.sim.nixl_transport import NixlUnavailable, load_nixl_api

pytestmark = [pytest.mark.nixl, pytest.mark.timeout(180)]

FAIL_ON_CORRUPT = "--fail-on-corrupt"


@pytest.fixture(scope="module")
def sims() -> Any:
    try:
        load_nixl_api()
    except NixlUnavailable as e:
        pytest.fail(f"nixl is required for the NIXL tier (CI and local): {e}")
    procs = {
        # Prefill without a prefix cache (as in the upstream blog's benchmark) so every replay has a D->P pull to do.
        "prefill": SimProcess(
            "prefill", "--no-enable-prefix-caching", "--kv-load-failure-policy", "recompute", FAIL_ON_CORRUPT
        ),
        "decode": SimProcess("decode", FAIL_ON_CORRUPT),
        "decode_short_ttl": SimProcess("decode", "--decoder-kv-blocks-ttl", "2", FAIL_ON_CORRUPT),
        "decode_unidirectional": SimProcess("decode", "--no-bidirectional", FAIL_ON_CORRUPT),
    }
    try:
        for p in procs.values():
            p.start()
        for p in procs.values():
            p.wait_ready()
        yield procs
    finally:
        for p in procs.values():
            p.stop()


# -- a hand-driven router ---------------------------------------------------------------------------------------
def post(sim: SimProcess, body: dict[str, Any], path: str = "/v1/chat/completions") -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(
        sim.url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def stream(sim: SimProcess, body: dict[str, Any]) -> list[Any]:
    """SSE `data:` payloads, decoded; the terminating `[DONE]` stays a string."""
    req = urllib.request.Request(
        sim.url + "/v1/chat/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        lines = [ln.decode().strip() for ln in resp]
    payloads = [ln[len("data: ") :] for ln in lines if ln.startswith("data: ")]
    return [p if p == "[DONE]" else json.loads(p) for p in payloads]


def conversation() -> list[dict[str, Any]]:
    tag = uuid.uuid4().hex
    system = f"Conversation {tag}. You are a careful assistant who answers questions about sailing, " * 4
    return [{"role": "system", "content": system}, {"role": "user", "content": "How do I reef a mainsail in a squall?"}]


def prefill_leg(p: SimProcess, body: dict[str, Any], params: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    return post(p, pr.prefill_leg_body(body, params))


def turn(
    p: SimProcess,
    d: SimProcess,
    messages: list[dict[str, Any]],
    replay: dict[str, Any] | None = None,
    max_tokens: int = 40,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """One P-D turn; returns (prefill reply, decode reply)."""
    body = {"model": "sim", "messages": messages, "max_tokens": max_tokens}
    params = pr.replay_params(replay) if replay else pr.miss_params()
    status, prefill = prefill_leg(p, body, params)
    assert status == 200, prefill
    status, decode = post(d, pr.decode_leg_body(body, prefill[pr.KV_PARAMS_FIELD]))
    assert status == 200, decode
    return prefill, decode


def next_messages(messages: list[dict[str, Any]], decode_reply: dict[str, Any]) -> list[dict[str, Any]]:
    answer = decode_reply["choices"][0]["message"]["content"]
    return messages + [{"role": "assistant", "content": answer}, {"role": "user", "content": "And in heavy seas?"}]


class Meter:
    """Metric deltas on one engine since construction."""

    NAMES = (
        "sim_nixl_reads_total",
        "sim_nixl_bytes_read_total",
        "sim_corrupt_blocks_total",
        "sim_retained_blocks",
        "vllm:nixl_num_kv_expired_reqs_total",
    )

    def __init__(self, sim: SimProcess):
        self.sim = sim
        self.before = self._read()

    def _read(self) -> dict[str, float]:
        samples = self.sim.metrics()
        out = {n: sum(v for name, _, v in samples if name == n) for n in self.NAMES}
        for source in ("local_compute", "local_cache_hit", "external_kv_transfer"):
            out[source] = sum(
                v
                for name, lbls, v in samples
                if name == "vllm:prompt_tokens_by_source_total" and lbls.get("source") == source
            )
        for name, lbls, v in samples:
            if name == "sim_recompute_skips_total":
                out[f"skip:{lbls['reason']}"] = v
        return out

    def delta(self) -> dict[str, float]:
        now = self._read()
        return {k: now.get(k, 0.0) - self.before.get(k, 0.0) for k in set(now) | set(self.before)}

    def settled(self, name: str, value: float, timeout: float = 5.0) -> float:
        """The delta of `name` once it reaches `value` (or at the timeout): owners free read blocks when the READ's
        NIXL note arrives, a moment after the reader has answered."""
        deadline = time.monotonic() + timeout
        while (got := self.delta()[name]) != value and time.monotonic() < deadline:
            time.sleep(0.01)
        return got


# -- tests ------------------------------------------------------------------------------------------------------
def test_turn1_decode_pulls_the_prompt_from_prefill(sims):
    p, d = sims["prefill"], sims["decode"]
    pm, dm = Meter(p), Meter(d)
    prefill, decode = turn(p, d, conversation())
    prompt_tokens = prefill["usage"]["prompt_tokens"]

    pp = prefill[pr.KV_PARAMS_FIELD]
    assert prefill["usage"]["completion_tokens"] == 1 and prefill["choices"][0]["finish_reason"] == "length"
    assert pp["do_remote_prefill"] is True and pp["do_remote_decode"] is False
    assert (pp["remote_engine_id"], pp["remote_port"]) == (p.engine_id, p.side_channel_port)
    assert pp["remote_num_tokens"] == prompt_tokens
    assert pr.block_count(pp["remote_block_ids"]) == -(-prompt_tokens // 16)

    dp = decode[pr.KV_PARAMS_FIELD]
    completion = decode["usage"]["completion_tokens"]
    assert decode["usage"]["prompt_tokens"] == prompt_tokens
    assert dp["do_remote_decode"] is True and dp["do_remote_prefill"] is False
    assert (dp["remote_engine_id"], dp["remote_host"], dp["remote_port"]) == (d.engine_id, d.host, d.side_channel_port)
    assert (dp["tp_size"], dp["dcp_size"], dp["pp_size"], dp["transfer_mode"]) == (1, 1, 1, "pull")
    assert dp["remote_num_tokens"] == prompt_tokens + completion - 1  # the last sampled token has no KV yet
    assert isinstance(dp["remote_blocks_expiry_time"], float)
    assert pr.replayable_decode_params(dp) is not None
    # The first token is the same on both legs: sampling is a function of the prompt.
    assert decode["choices"][0]["message"]["content"].split()[0] == prefill["choices"][0]["message"]["content"]

    assert dm.delta()["external_kv_transfer"] == prompt_tokens
    assert dm.delta()["sim_nixl_reads_total"] == 1 and dm.delta()["sim_corrupt_blocks_total"] == 0
    assert pm.settled("sim_retained_blocks", 0) == 0  # decode's READ note freed prefill's leased blocks


def test_turn2_prefill_reads_decodes_retained_blocks(sims):
    p, d = sims["prefill"], sims["decode"]
    messages = conversation()
    _, decode1 = turn(p, d, messages)
    dp = pr.replayable_decode_params(decode1[pr.KV_PARAMS_FIELD])
    messages2 = next_messages(messages, decode1)

    pm, dm = Meter(p), Meter(d)
    prefill2, decode2 = turn(p, d, messages2, replay=dp)
    pd, dd = pm.delta(), dm.delta()
    assert pd["sim_nixl_reads_total"] == 1 and pd["sim_nixl_bytes_read_total"] > 0
    assert pd["external_kv_transfer"] == dp["remote_num_tokens"]  # the whole previous turn, prompt + reply
    assert pd["local_compute"] == prefill2["usage"]["prompt_tokens"] - dp["remote_num_tokens"]
    assert pd["sim_corrupt_blocks_total"] == 0
    # Decode freed what prefill read, kept its blocks in its prefix cache, and pulled only the new suffix.
    assert dd["local_cache_hit"] >= dp["remote_num_tokens"] // 16 * 16 > 0
    assert dd["external_kv_transfer"] == prefill2["usage"]["prompt_tokens"] - dd["local_cache_hit"]
    assert dd["sim_corrupt_blocks_total"] == 0
    assert pr.replayable_decode_params(decode2[pr.KV_PARAMS_FIELD]) is not None


def test_second_replay_of_the_same_params_reads_nothing(sims):
    p, d = sims["prefill"], sims["decode"]
    messages = conversation()
    _, decode1 = turn(p, d, messages)
    dp = pr.replayable_decode_params(decode1[pr.KV_PARAMS_FIELD])
    body = {"model": "sim", "messages": next_messages(messages, decode1), "max_tokens": 20}
    status, _ = prefill_leg(p, body, pr.replay_params(dp))
    assert status == 200

    pm = Meter(p)
    status, again = prefill_leg(p, body, pr.replay_params(dp))
    assert status == 200, again
    delta = pm.delta()
    assert delta["sim_nixl_reads_total"] == 0 and delta["sim_corrupt_blocks_total"] == 0
    assert delta["skip:blocks_gone"] == 1
    assert delta["local_compute"] == again["usage"]["prompt_tokens"] and delta["external_kv_transfer"] == 0


def test_expired_blocks_are_declined(sims):
    p, d = sims["prefill"], sims["decode_short_ttl"]
    messages = conversation()
    _, decode1 = turn(p, d, messages)
    dp = pr.replayable_decode_params(decode1[pr.KV_PARAMS_FIELD])
    with urllib.request.urlopen(f"http://{d.host}:{d.side_channel_port}/handshake", timeout=5) as resp:
        decode_clock = json.loads(resp.read())["clock"]
    assert 0 < dp["remote_blocks_expiry_time"] - decode_clock <= 2  # a deadline on decode's own clock

    pm = Meter(p)
    status, reply = prefill_leg(p, {"model": "sim", "messages": next_messages(messages, decode1)}, pr.replay_params(dp))
    assert status == 200, reply  # kv_load_failure_policy=recompute
    delta = pm.delta()
    assert delta["vllm:nixl_num_kv_expired_reqs_total"] == 1 and delta["skip:expired"] == 1
    assert delta["sim_nixl_reads_total"] == 0 and delta["external_kv_transfer"] == 0


def test_streaming_decode_returns_params_on_the_final_chunk(sims):
    p, d = sims["prefill"], sims["decode"]
    messages = conversation()
    body = {
        "model": "sim",
        "messages": messages,
        "max_tokens": 30,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    status, prefill = prefill_leg(p, body, pr.miss_params())
    assert status == 200
    events = stream(d, pr.decode_leg_body(body, prefill[pr.KV_PARAMS_FIELD]))

    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    # vLLM 0.33's framing: the field is on every token chunk, null until the finishing chunk carries the params;
    # the role chunk and the usage chunk do not have it.
    with_params = [c for c in chunks if c.get(pr.KV_PARAMS_FIELD) is not None]
    final = next(c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"])
    assert with_params == [final]
    tokens = [c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")]
    assert all(pr.KV_PARAMS_FIELD in c for c in tokens)
    assert pr.KV_PARAMS_FIELD not in chunks[0] and pr.KV_PARAMS_FIELD not in chunks[-1]
    usage = chunks[-1]["usage"]
    params = final[pr.KV_PARAMS_FIELD]
    assert params["remote_num_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"] - 1
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])

    # The streamed params are as good as non-streamed ones for the next turn.
    follow = messages + [{"role": "assistant", "content": text}, {"role": "user", "content": "thanks"}]
    pm = Meter(p)
    status, _ = prefill_leg(
        p, {"model": "sim", "messages": follow}, pr.replay_params(pr.replayable_decode_params(params))
    )
    assert status == 200
    assert pm.delta()["sim_nixl_reads_total"] == 1 and pm.delta()["sim_corrupt_blocks_total"] == 0


def test_unidirectional_decode_returns_no_params(sims):
    p, d = sims["prefill"], sims["decode_unidirectional"]
    dm = Meter(d)
    prefill, decode = turn(p, d, conversation())
    assert decode[pr.KV_PARAMS_FIELD] is None
    assert dm.delta()["external_kv_transfer"] == prefill["usage"]["prompt_tokens"]  # it still pulls from prefill
    assert dm.delta()["sim_retained_blocks"] == 0

    body = {"model": "sim", "messages": conversation(), "max_tokens": 5, "stream": True}
    status, prefill = prefill_leg(p, body, pr.miss_params())
    assert status == 200
    events = stream(d, pr.decode_leg_body(body, prefill[pr.KV_PARAMS_FIELD]))
    assert not [e for e in events if isinstance(e, dict) and e.get(pr.KV_PARAMS_FIELD) is not None]


def test_replay_with_another_conversations_prompt_is_detected(sims):
    p, d = sims["prefill"], sims["decode"]
    conv_a, conv_b = conversation(), conversation()
    _, decode_a = turn(p, d, conv_a)
    _, decode_b = turn(p, d, conv_b)
    params_a = pr.replayable_decode_params(decode_a[pr.KV_PARAMS_FIELD])

    pm = Meter(p)
    body_b2 = {"model": "sim", "messages": next_messages(conv_b, decode_b)}
    status, reply = prefill_leg(p, body_b2, pr.replay_params(params_a))
    assert status == 500 and "corrupt" in reply["error"]["message"]  # --fail-on-corrupt
    delta = pm.delta()
    assert delta["sim_nixl_reads_total"] == 1 and delta["sim_corrupt_blocks_total"] > 0


def test_plain_requests_serve_locally_and_identically(sims):
    p, d = sims["prefill"], sims["decode"]
    body = {"model": "sim", "prompt": f"Once upon a time {uuid.uuid4().hex}", "max_tokens": 12}
    (sp, rp), (sd, rd) = post(p, body, "/v1/completions"), post(d, body, "/v1/completions")
    assert sp == sd == 200
    assert rp["choices"][0]["text"] == rd["choices"][0]["text"] and rp[pr.KV_PARAMS_FIELD] is None
    assert rp["usage"]["completion_tokens"] == 12 and rp["choices"][0]["finish_reason"] == "length"
    assert post(d, {**body, "model": "nope"}, "/v1/completions")[0] == 404
    assert post(d, {**body, "prompt": ""}, "/v1/completions")[0] == 400
    with urllib.request.urlopen(d.url + "/v1/models", timeout=5) as resp:
        assert [m["id"] for m in json.loads(resp.read())["data"]] == ["sim"]


def test_concurrent_conversations_stay_consistent(sims):
    p, d = sims["prefill"], sims["decode"]
    pm, dm = Meter(p), Meter(d)

    def two_turns(_: int) -> None:
        messages = conversation()
        _, decode1 = turn(p, d, messages)
        turn(p, d, next_messages(messages, decode1), replay=pr.replayable_decode_params(decode1[pr.KV_PARAMS_FIELD]))

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(two_turns, range(8)))
    assert pm.delta()["sim_nixl_reads_total"] == 8 and dm.delta()["sim_nixl_reads_total"] == 16
    assert pm.delta()["sim_corrupt_blocks_total"] == dm.delta()["sim_corrupt_blocks_total"] == 0


def test_idle_engines_leave_the_cpu_alone(sims):
    """NIXL's progress thread must sleep between events; its default poll timeout of 0 spun half a core per engine."""

    def cpu_seconds(pid: int) -> float:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    p, d = sims["prefill"], sims["decode"]
    turn(p, d, conversation())  # both agents connected, as after real traffic
    pids = [p.process.pid, d.process.pid]
    before, t0 = [cpu_seconds(pid) for pid in pids], time.monotonic()
    time.sleep(2)
    elapsed = time.monotonic() - t0
    busy = [(cpu_seconds(pid) - b) / elapsed for pid, b in zip(pids, before, strict=False)]
    assert max(busy) < 0.1, f"idle engines use {busy} of a core"


def test_launcher_reports_a_failed_start_with_the_log():
    bad = SimProcess("decode", "--block-bytes", "100", startup_timeout=20)
    with pytest.raises(SimStartError, match="block-bytes") as info, bad:
        pass
    assert "exited with code" in str(info.value)
    os.remove(bad.log_path)  # kept by the launcher because the engine failed


async def test_async_sim_pair_serves_a_turn():
    from duplex_dev.launch.sim import async_sim_pair

    async with async_sim_pair(decode_args=("--no-bidirectional",), model="m2") as (p, d):
        assert p.role == "prefill" and d.role == "decode" and p.port != d.port
        body = {"model": "m2", "messages": conversation(), "max_tokens": 3}
        status, prefill = post(p, pr.prefill_leg_body(body, pr.miss_params()))
        assert status == 200
        status, decode = post(d, pr.decode_leg_body(body, prefill[pr.KV_PARAMS_FIELD]))
        assert status == 200 and decode[pr.KV_PARAMS_FIELD] is None
        assert d.metric("sim_nixl_reads_total") == 1
    assert p.process.returncode == 0 and d.process.returncode == 0  # SIGTERM shuts down cleanly

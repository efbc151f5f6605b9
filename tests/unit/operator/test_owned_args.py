"""extraArgs may not carry a flag duplex sets itself: each one is refused, in both `--flag value` and `--flag=value`
form, wherever extraArgs appear, with a message naming the typed field to use; any other argument passes through."""

from __future__ import annotations

from typing import ClassVar

import pytest
from dsv_helpers import may_name_an_owned_flag, spec, spec_dict
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from duplex.api.owned_args import OWNED_FLAGS, owned_arg_rules, uses_flag
from duplex.api.spec import DecodeSpec, ModelSpec, PrefillSpec
from duplex.children.engine import engine_workload, vllm_args
from duplex.children.roles import EngineRole
from duplex.render import InvalidSpec, parse_spec

ALL_FLAGS = [f for flags, _ in OWNED_FLAGS for f in flags]
LOCATIONS = ["model", "prefill", "decode"]

# The typed field each flag must point users to, per location.
EXPECTED_FIELD = {
    "--kv-transfer-config": "spec.kvTransfer",
    "--tensor-parallel-size": "spec.{role}.tensorParallelSize",
    "-tp": "spec.{role}.tensorParallelSize",
    "--pipeline-parallel-size": "spec.{role}.pipelineParallelSize",
    "-pp": "spec.{role}.pipelineParallelSize",
    "--nnodes": "spec.{role}.nodesPerInstance",
    "-n": "spec.{role}.nodesPerInstance",
    "--node-rank": "spec.{role}.nodesPerInstance",
    "-r": "spec.{role}.nodesPerInstance",
    "--master-addr": "spec.{role}.nodesPerInstance",
    "--headless": "spec.{role}.nodesPerInstance",
    "--model": "spec.model.name",
    "--served-model-name": "spec.model.servedModelName",
    "--dtype": "spec.model.dtype",
    "--max-model-len": "spec.model.maxModelLen",
    "--block-size": "spec.model.blockSize",
    "--gpu-memory-utilization": "spec.{role}.gpuMemoryUtilization",
    "--enable-prefix-caching": "spec.{role}.enablePrefixCaching",
    "--no-enable-prefix-caching": "spec.{role}.enablePrefixCaching",
    "--max-num-seqs": "spec.{role}.maxNumSeqs",
    "--max-num-batched-tokens": "spec.{role}.maxNumBatchedTokens",
    "--tool-call-parser": "spec.model.toolCallParser",
    "--enable-auto-tool-choice": "spec.model.toolCallParser",
    "--reasoning-parser": "spec.model.reasoningParser",
}
NOT_CONFIGURABLE = {
    "--port": "port 8000",
    "--host": "every pod address",
    "--middleware": "the engine key on every path but /health and /metrics",
    "--shutdown-timeout": "derived from kvTransfer.leaseDuration and the decode drain",
    "--distributed-executor-backend": "mp across the nodes of a multi-node instance",
}


def test_the_owned_flags_are_the_ones_duplex_renders() -> None:
    assert set(ALL_FLAGS) == set(EXPECTED_FIELD) | set(NOT_CONFIGURABLE)
    # Every flag duplex itself puts on the command line is owned (the model is positional).
    s = spec(
        {
            "model": {"maxModelLen": 1024, "toolCallParser": "hermes", "reasoningParser": "qwen3"},
            "prefill": {"maxNumSeqs": 2, "maxNumBatchedTokens": 4},
        }
    )
    rendered = vllm_args(s, EngineRole.of(s, "prefill"))
    assert {a for a in rendered if a.startswith("-")} <= set(ALL_FLAGS)


def test_the_multinode_launch_flags_are_owned() -> None:
    """What a LeaderWorkerSet's leader and workers add (children/lws.py) cannot come from extraArgs either."""
    s = spec(
        {
            "network": {"efa": {"enabled": True}},
            "prefill": {"memory": "1Gi"},
            "decode": {"memory": "1Gi", "nodesPerInstance": 2, "tensorParallelSize": 8, "pipelineParallelSize": 2},
        }
    )
    lws = engine_workload(s, "demo", "ns1", "decode")
    for rank in ("leaderTemplate", "workerTemplate"):
        (engine,) = lws["spec"]["leaderWorkerTemplate"][rank]["spec"]["containers"]
        flags = {a for a in engine["args"] if a.startswith("-")}
        assert {"--pipeline-parallel-size", "--nnodes", "--node-rank", "--master-addr"} <= flags
        assert flags <= set(ALL_FLAGS)


@pytest.mark.parametrize(
    "args",
    [
        ["--nnodes", "4"],
        ["-n", "4"],
        ["--node-rank=1"],
        ["-r", "1"],
        ["--master-addr", "10.0.0.1"],
        ["--headless"],
        ["--pipeline-parallel-size", "4"],
        ["-pp", "4"],
        ["--pipeline_parallel_size=4"],
        ["--pipeline-parallel=4"],  # argparse's abbreviation
        ["--distributed-executor-backend", "ray"],
    ],
)
def test_extra_args_cannot_change_the_multinode_launch(args: list[str]) -> None:
    patch = {
        "network": {"efa": {"enabled": True}},
        "prefill": {"memory": "1Gi"},
        "decode": {"memory": "1Gi", "nodesPerInstance": 2, "tensorParallelSize": 8, "pipelineParallelSize": 2}
        | {"extraArgs": args},
    }
    with pytest.raises(InvalidSpec) as info:
        parse_spec(spec_dict(patch))
    assert [e.split(": ", 1)[0] for e in info.value.errors] == ["spec.decode.extraArgs"]


def _field(flag: str, location: str) -> str:
    role = "prefill|decode" if location == "model" else location
    return EXPECTED_FIELD[flag].format(role=role)


def _reject(location: str, args: list[str]) -> list[str]:
    with pytest.raises(InvalidSpec) as info:
        parse_spec(spec_dict({location: {"extraArgs": args}}))
    return info.value.errors


@pytest.mark.parametrize("location", LOCATIONS)
@pytest.mark.parametrize("flag", ALL_FLAGS)
@pytest.mark.parametrize("form", ["separate", "equals"])
def test_owned_flag_rejected(flag: str, location: str, form: str) -> None:
    args = ["--enforce-eager", flag, "7"] if form == "separate" else ["--enforce-eager", f"{flag}=7"]
    errors = _reject(location, args)
    assert len(errors) == 1, errors
    path, _, message = errors[0].partition(": ")
    assert path == f"spec.{location}.extraArgs"
    assert flag in message.split(" is set by duplex")[0].split(" / ")
    if flag in NOT_CONFIGURABLE:
        assert message.endswith(")") and NOT_CONFIGURABLE[flag] in message
    else:
        assert message.endswith(f"is set by duplex; use {_field(flag, location)} instead")


@pytest.mark.parametrize("location", LOCATIONS)
def test_a_list_of_every_owned_flag_is_rejected_at_extra_args(location: str) -> None:
    errors = _reject(location, [f"{f}=1" for f in ALL_FLAGS])
    assert errors and all(e.startswith(f"spec.{location}.extraArgs: ") and "is set by duplex" in e for e in errors)


@pytest.mark.parametrize(
    "arg",
    [
        "--portable",
        "--port-offset=1",
        "--hostname",
        "--model-impl",
        "--model-loader-extra-config={}",
        "--dtype-check",
        "--block-size-x",
        "--max-model-length",
        "--served-model-names",
        "--kv-transfer-configs",
        "--max-num-seqs-per-step",
        "--enable-prefix-caching-hash",
        "port",
        "8000",
        "--swap-space=--port",
        "--enforce-eager",
        "--swap-space=8",
        "",
    ],
)
@pytest.mark.parametrize("location", LOCATIONS)
def test_look_alike_arguments_pass(arg: str, location: str) -> None:
    assert not may_name_an_owned_flag(arg)  # not a spelling vLLM would read as an owned flag
    parsed = spec({location: {"extraArgs": [arg]}})
    assert getattr(parsed, location).extra_args == [arg]


def test_role_rules_name_their_own_role() -> None:
    for cls, role in ((PrefillSpec, "prefill"), (DecodeSpec, "decode")):
        messages = " ".join(r.message for r in cls.RULES)
        assert f"spec.{role}.tensorParallelSize" in messages
        other = "decode" if role == "prefill" else "prefill"
        assert f"spec.{other}." not in messages
    assert "spec.prefill|decode.tensorParallelSize" in " ".join(r.message for r in ModelSpec.RULES)


@pytest.mark.parametrize("role", [None, "prefill", "decode"])
def test_one_rule_per_owned_flag_group_reported_at_extra_args(role: str | None) -> None:
    rules = owned_arg_rules(role)
    assert len(rules) == len(OWNED_FLAGS)
    assert all(r.field_path == ".extraArgs" for r in rules)
    for rule, (flags, _) in zip(rules, OWNED_FLAGS, strict=False):
        assert rule.cel.startswith("!has(self.extraArgs) || !self.extraArgs.map(a, ")
        assert "a.split('=')[0].split('.')[0].replace('_', '-')" in rule.cel  # the same key normalisation
        for f in flags:
            assert f"k == '{f}' ||" in rule.cel and f"'{f}'.startsWith(k)" in rule.cel


@pytest.mark.parametrize("role", [None, "prefill", "decode"])
def test_rule_predicates_match_flags(role: str | None) -> None:
    class Holder:
        extra_args: ClassVar[list[str]] = []

    for rule, (flags, _) in zip(owned_arg_rules(role), OWNED_FLAGS, strict=False):
        empty = Holder()
        assert rule.holds(empty)
        for f in flags:
            bad = Holder()
            bad.extra_args = ["--x", f]
            assert not rule.holds(bad)
            bad.extra_args = [f"{f}=v"]
            assert not rule.holds(bad)
        for other in ALL_FLAGS:
            if other not in flags:
                ok = Holder()
                ok.extra_args = [other, f"{other}=1"]
                assert rule.holds(ok), (rule.message, other)


def test_uses_flag() -> None:
    assert uses_flag(["--port"], "--port")
    assert uses_flag(["a", "--port=1"], "--port")
    assert uses_flag(["--port="], "--port")
    assert not uses_flag(["--portx"], "--port")
    assert not uses_flag(["-port"], "--port")
    assert not uses_flag([], "--port")
    assert not uses_flag(["x--port"], "--port")


# Arguments that cannot name an owned flag in any spelling vLLM accepts.
_free_arg = st.text(alphabet=st.characters(codec="ascii", categories=("L", "N", "P", "S")), max_size=40).filter(
    lambda a: not may_name_an_owned_flag(a)
)
_flag_like = st.builds(
    lambda name, value: f"--{name}" + (f"={value}" if value else ""),
    st.from_regex(r"[a-z][a-z0-9-]{0,30}", fullmatch=True),
    st.one_of(st.just(""), st.from_regex(r"[A-Za-z0-9.{}:,]{1,12}", fullmatch=True)),
)
_free_args = st.lists(st.one_of(_free_arg, _flag_like), max_size=12).filter(
    lambda args: not any(may_name_an_owned_flag(a) for a in args)
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(model_args=_free_args, prefill_args=_free_args, decode_args=_free_args)
def test_random_extra_args_without_owned_flags_are_accepted_and_appended(
    model_args: list[str], prefill_args: list[str], decode_args: list[str]
) -> None:
    parsed = parse_spec(
        spec_dict(
            {
                "model": {"extraArgs": model_args},
                "prefill": {"extraArgs": prefill_args},
                "decode": {"extraArgs": decode_args},
            }
        )
    )
    for role, role_args in (("prefill", prefill_args), ("decode", decode_args)):
        args = vllm_args(parsed, EngineRole.of(parsed, role))
        tail = model_args + role_args
        assert args[len(args) - len(tail) :] == tail
        # duplex's own flags come first and exactly once, so the typed fields are what vLLM sees
        head = args[: len(args) - len(tail)]
        assert head.count("--tensor-parallel-size") == 1 and head.count("--kv-transfer-config") == 1


@settings(max_examples=40, deadline=None)
@given(
    flag=st.sampled_from(ALL_FLAGS),
    location=st.sampled_from(LOCATIONS),
    before=st.lists(_flag_like, max_size=4),
    after=st.lists(_flag_like, max_size=4),
    equals=st.booleans(),
    value=st.from_regex(r"[a-z0-9]{0,8}", fullmatch=True),
)
def test_an_owned_flag_anywhere_in_the_list_is_rejected(
    flag: str, location: str, before: list[str], after: list[str], equals: bool, value: str
) -> None:
    owned = [f"{flag}={value}"] if equals else [flag, value]
    errors = _reject(location, before + owned + after)
    assert errors and all(e.startswith(f"spec.{location}.extraArgs: ") for e in errors)
    assert "is set by duplex" in errors[0]

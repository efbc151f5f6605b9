"""The image's `vllm` entry point: the command line duplex renders for an engine, as `duplex sim` options."""

from __future__ import annotations

import json

import pytest

from duplex.children import engine_guard
from duplex_sidecars.sim import cli as sim_cli
from duplex_sidecars.sim.vllm_cli import Refused, translate


def _kv(role: str = "kv_producer", **extra: object) -> str:
    cfg = {
        "kv_connector": "NixlConnector",
        "kv_role": role,
        "kv_buffer_device": "cpu",
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {
            "backends": ["UCX"],
            "bidirectional_kv_xfer": True,
            "decoder_kv_blocks_ttl": 480,
            "kv_lease_duration": 30,
            "kv_recompute_threshold": 64,
            **extra,
        },
    }
    return json.dumps(cfg)


ENV = {"VLLM_NIXL_SIDE_CHANNEL_HOST": "198.18.0.7", "VLLM_NIXL_SIDE_CHANNEL_PORT": "5600"}


def test_a_rendered_prefill_command_line_becomes_the_simulators() -> None:
    argv = ["serve", "Qwen/Qwen3-0.6B", "--served-model-name", "qwen", "--port", "8000", "--tensor-parallel-size",
            "1", "--dtype", "float32", "--block-size", "32", "--enable-prefix-caching", "--max-model-len", "8192",
            "--max-num-seqs", "8", "--kv-transfer-config", _kv()]  # fmt: skip
    args = sim_cli.parser().parse_args(translate(argv, ENV))
    cfg = sim_cli.config_from_args(args)
    assert (cfg.role, cfg.host, cfg.port, cfg.model) == ("prefill", "0.0.0.0", 8000, "qwen")
    assert (cfg.side_channel_host, cfg.side_channel_port) == ("198.18.0.7", 5600)
    assert (cfg.block_size, cfg.max_model_len, cfg.enable_prefix_caching) == (32, 8192, True)
    assert (cfg.bidirectional, cfg.decoder_kv_blocks_ttl, cfg.kv_recompute_threshold) == (True, 480, 64)
    assert (cfg.kv_lease_duration, cfg.kv_load_failure_policy, cfg.nixl_backend) == (30, "recompute", "UCX")


def test_decode_the_model_name_served_and_equals_syntax() -> None:
    args = sim_cli.parser().parse_args(translate(["serve", "m", f"--kv-transfer-config={_kv('kv_consumer')}"], {}))
    cfg = sim_cli.config_from_args(args)
    assert (cfg.role, cfg.model) == ("decode", "m")


def test_the_engine_guard_the_operator_renders_puts_the_key_on_every_path() -> None:
    argv = ["serve", "m", "--middleware", engine_guard.MIDDLEWARE]
    assert sim_cli.config_from_args(sim_cli.parser().parse_args(translate(argv, {}))).key_on_every_path
    assert not sim_cli.config_from_args(sim_cli.parser().parse_args(translate(["serve", "m"], {}))).key_on_every_path


def test_extra_simulator_options_come_from_the_environment() -> None:
    args = translate(["serve", "m"], {"DUPLEX_SIM_ARGS": "--time-scale 0.1 --decode-us-per-token 5"})
    assert args[-4:] == ["--time-scale", "0.1", "--decode-us-per-token", "5"]


@pytest.mark.parametrize(
    ("argv", "reason"),
    [
        (["serve", "m", "--kv-transfer-config", _kv(backends=["LIBFABRIC"])], "moves KV over UCX only"),
        (["serve", "m", "--kv-transfer-config", json.dumps({"kv_connector": "LMCache"})], "NixlConnector only"),
        (["serve", "m", "--kv-transfer-config", "{"], "not JSON"),
        (["serve", "m", "--no-such-flag", "1"], "unknown or unsupported vLLM option --no-such-flag"),
        (["chat", "m"], "only `vllm serve MODEL"),
        (["serve", "--port", "1"], "needs the model"),
        (["serve", "m", "--port"], "--port needs a value"),
        (["serve", "m", "--middleware", "my.Logger"], "runs no ASGI middleware but duplex_engine_guard"),
    ],
)
def test_what_the_simulator_cannot_honour_is_refused_with_the_reason(argv: list[str], reason: str) -> None:
    with pytest.raises(Refused, match="duplex engine simulator") as err:
        translate(argv, {})
    assert reason in str(err.value)

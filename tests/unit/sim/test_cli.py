"""`duplex sim` flags map onto SimConfig."""

import pytest

from duplex_sidecars.sim.cli import config_from_args, parser


def _cfg(*argv):
    return config_from_args(parser().parse_args(["--role", "decode", *argv]))


def test_defaults_match_vllm_and_cost_nothing():
    cfg = _cfg()
    assert (cfg.block_size, cfg.kv_recompute_threshold, cfg.decoder_kv_blocks_ttl) == (16, 64, 480.0)
    assert cfg.bidirectional and cfg.enable_prefix_caching and cfg.kv_load_failure_policy == "fail"
    assert cfg.engine_id.startswith("sim-decode-") and cfg.model == "sim"
    assert cfg.cost.prefill_seconds(1000, 1000) == 0.0


def test_flags():
    cfg = _cfg(
        "--no-bidirectional",
        "--engine-id",
        "d1",
        "--served-model-name",
        "Qwen",
        "--kv-load-failure-policy",
        "recompute",
        "--decode-us-per-token",
        "500",
        "--side-channel-port",
        "5601",
        "--fail-on-corrupt",
    )
    assert not cfg.bidirectional and cfg.engine_id == "d1" and cfg.model == "Qwen"
    assert cfg.kv_load_failure_policy == "recompute" and cfg.side_channel_port == 5601 and cfg.fail_on_corrupt
    assert cfg.cost.decode_seconds() == pytest.approx(0.0005)
    assert cfg.advertised_host == "127.0.0.1"


def test_block_bytes_must_be_whole_slots():
    with pytest.raises(SystemExit):
        _cfg("--block-bytes", "100")


def test_a_cost_profile_with_a_flag_over_it_and_a_time_scale(tmp_path):
    profile = tmp_path / "cost.json"
    profile.write_text('{"cost": {"prefill_us_per_token": 3000, "decode_us_per_token": 50000}}')
    cfg = _cfg(
        "--cost-profile",
        str(profile),
        "--decode-us-per-token",
        "1000",
        "--read-back-latency-ms",
        "100",
        "--time-scale",
        "0.5",
    )
    assert cfg.cost.prefill_seconds(100, 0) == pytest.approx(0.15)
    assert cfg.cost.decode_seconds() == pytest.approx(0.0005)
    assert cfg.cost.read_seconds(0, read_back=True) == pytest.approx(0.05)


@pytest.mark.parametrize(
    "argv", [("--time-scale", "0"), ("--read-back-latency-ms", "-1"), ("--cost-profile", "/nonexistent.json")]
)
def test_bad_cost_flags_exit_with_a_message(argv, capsys):
    with pytest.raises(SystemExit, match="duplex sim: "):
        _cfg(*argv)

"""The real-engine launcher runs what the operator renders for a CPU example: what vLLM's CPU build needs comes from
the rendering, and the launcher's own table changes only what a host process needs."""

from __future__ import annotations

from pathlib import Path

import pytest

from duplex_dev.launch.vllm import Local, cpu_command, guard_dir, rendered_engine, served_model
from duplex_dev.processes import LaunchError

LOCAL = Local(Path("/models/test"), 2048, "127.0.0.1", 18000, 15600, Path("/tmp/guard"))
# What vLLM's CPU build needs, rendered by the operator for accelerator.type cpu: never the launcher's change.
RENDERED_FOR_CPU = {"--block-size", "--tensor-parallel-size", "kv_buffer_device", "backends", "VLLM_CPU_KVCACHE_SPACE"}


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_cpu_needs_come_from_the_rendering(role: str) -> None:
    cmd, changes = cpu_command(rendered_engine(role, "examples/local.yaml"), LOCAL)
    assert not {c.what.rsplit(".", 1)[-1] for c in changes} & RENDERED_FOR_CPU
    assert cmd.flags["--block-size"] == "32" and cmd.flags["--tensor-parallel-size"] == "1"
    assert cmd.kv["kv_buffer_device"] == "cpu" and cmd.extra["backends"] == ["UCX"]
    assert cmd.env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert cmd.env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "15600" and cmd.flags["--port"] == "18000"
    assert cmd.env["PYTHONPATH"] == "/tmp/guard" and cmd.flags["--middleware"] == "duplex_engine_guard.EngineKeyGuard"
    assert all(c.reason for c in changes)


def test_the_engine_guard_is_written_as_the_pod_mounts_it() -> None:
    files = {p.name: p.read_text() for p in guard_dir("examples/local.yaml").iterdir()}
    assert sorted(files) == ["duplex_drain.py", "duplex_engine_guard.py"]
    assert "class EngineKeyGuard" in files["duplex_engine_guard.py"]


def test_a_gpu_rendering_is_refused_with_the_way_out() -> None:
    with pytest.raises(LaunchError, match=r"accelerator\.type: cpu"):
        cpu_command(rendered_engine("prefill", "examples/seed.yaml"), LOCAL)


def test_clients_send_the_rendered_served_model_name() -> None:
    assert served_model("examples/local.yaml") == "qwen3-0.6b"

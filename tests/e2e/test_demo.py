"""`make run`, the main job, end to end as a new user runs it (`hack/demo.sh`), on a cluster of its own with a real
node: the chart's operator pod makes examples/local.yaml Ready, its router pod verifies the engine pods, and a live
chat through the router's Service reuses decode's KV on every follow-up turn. The demo checks that last part itself
and exits 1 when it fails."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A state dir shallow enough for the kubelet's unix sockets (pytest's tmp_path grows with every run)."""
    path = Path(tempfile.mkdtemp(prefix="dx-demo-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_make_run_brings_up_the_local_example_and_its_chat_reuses_decode_s_kv(image: str, short_tmp: Path):
    env = {**os.environ, "DUPLEX_CLUSTER_DIR": str(short_tmp / "cluster")}
    run = subprocess.run(
        ["bash", "hack/demo.sh", "--turns", "3", "--down"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    out = run.stdout
    assert run.returncode == 0, f"{out[-3000:]}\n{run.stderr[-3000:]}"
    assert re.search(r"canary \(verified\)", out), out[-3000:]
    # Turn 2 can reuse only turn 1's short prompt and reply, under the example's 64-token threshold: recomputed. Turn 3
    # reads turn 2's history (a tool output) back from decode.
    assert "router reuse hits: 1 of 2 possible (1 shorter than the 64-token recompute threshold" in out, out[-3000:]
    assert "corrupt blocks: 0 (counted by the engine pods)" in out
    assert re.search(r"pod/local-router-\S+ +1/1 +Running +0 .* duplex-node ", out), out[-3000:]
    rows = re.findall(r"^\s+(\d) +(\d+) +([\d.]+) ms +([\d.]+) ms +(-?\d+)%$", out, re.M)
    assert [int(r[0]) for r in rows] == [1, 2, 3], out[-3000:]
    assert int(rows[2][4]) > 20, rows  # the replayed turn: decode's blocks instead of ~1.7k tokens of compute
    assert "The local cluster is stopped" in out

"""`make bench-ttft`'s harness on real engines, in its quick form: every contender measured on every turn, the
oracle's untimed warm-up (which goes to the engines around the router, with the engine key) really leaves the
previous turn in prefill's cache, and each turn's receipt agrees with what prefill counted. The full run takes ~45
min; this one a few, with its own two engines, before the tier's session engines start (`own_engines`)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.own_engines
def test_the_quick_ttft_bench_measures_every_contender_and_warms_the_oracle(model_dir: Path, tmp_path: Path):
    stem = tmp_path / "ttft"
    argv = [sys.executable, "bench/ttft_bench.py", "--quick", "--topologies", "1P1D", "--out", str(stem)]
    run = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert run.returncode == 0, run.stderr[-4000:]
    results = json.loads(stem.with_suffix(".json").read_text())
    assert results["complete"]
    samples = results["samples"]
    assert Counter(s["contender"] for s in samples) == {"recompute": 6, "duplex": 6, "oracle": 6}  # 2 convs x 3
    later = [s for s in samples if s["turn"] > 0]
    for s in later:
        if s["contender"] == "oracle":
            assert s["local_tokens"] > 0 and s["computed_tokens"] < s["prompt_tokens"], s
        if s["contender"] == "recompute":
            assert s["local_tokens"] == 0 and s["external_tokens"] == 0, s
        # the receipt and prefill's counters agree: a read only on a turn the receipt calls a hit (a hit offers
        # decode's blocks; prefill may take some or all of them from its own prefix cache instead)
        assert s["replayed"] == (s["reused_tokens"] > 0), s
        if s["external_tokens"] > 0:
            assert s["replayed"], s
        if s["replayed"]:
            assert s["contender"] == "duplex" and s["external_tokens"] + s["local_tokens"] > 0, s
    assert any(s["replayed"] for s in later if s["contender"] == "duplex")
    assert all(s["ttft_s"] > 0 and s["prefill_engine"] == 0 for s in samples)
    assert stem.with_suffix(".md").read_text().startswith("#")

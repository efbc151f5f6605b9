"""The benchmarks' load generators read a chat completion's SSE stream a line at a time: the reply's text, the KV
parameters an engine shows, [DONE], and an error event after the answer began."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))

from loadgen import InBandError, Stream


def data(obj: object) -> bytes:
    return b"data: " + json.dumps(obj).encode()


def delta(text: str) -> bytes:
    return data({"choices": [{"index": 0, "delta": {"content": text}}]})


def test_text_comes_in_order_and_done_ends_it():
    said = Stream()
    lines = [b": keep-alive", delta("hel"), b"", data({"choices": [{"delta": {}}]}), delta("lo"), b"data: [DONE]"]
    carried = [said.take(line) for line in lines]
    assert carried == [False, True, False, False, True, False]
    assert "".join(said.parts) == "hello" and said.done and said.kv is None


def test_kv_parameters_are_kept_and_a_stream_without_done_is_not_done():
    said = Stream()
    said.take(data({"choices": [], "kv_transfer_params": {"remote_block_ids": [1, 2]}}))
    assert said.kv == {"remote_block_ids": [1, 2]} and not said.done


def test_an_error_event_raises_with_what_it_said():
    said = Stream()
    said.take(delta("par"))
    with pytest.raises(InBandError, match="decode went away"):
        said.take(data({"error": {"message": "decode went away", "code": 502}}))

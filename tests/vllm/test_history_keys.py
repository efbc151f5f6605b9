"""The router's history digest (router/history.py) keeps exactly the message keys vLLM renders into a prompt, and
drops only keys vLLM's own reply carries and never renders. Read from vLLM 0.33's types, so that a key vLLM starts
to render shows up here."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from duplex_sidecars.router.history import DECORATION_KEYS, MESSAGE_KEYS

pytestmark = pytest.mark.vllm

PROBE = """
import json
from vllm.renderers.chat_utils.types import ConversationMessage, CustomChatCompletionMessageParam
from vllm.entrypoints.openai.chat_completion.protocol import ChatMessage
print(json.dumps({
    "rendered": sorted(ConversationMessage.__annotations__),
    "accepted": sorted(CustomChatCompletionMessageParam.__annotations__),
    "reply": sorted(ChatMessage.model_fields),
}))
"""


@pytest.fixture(scope="module")
def vllm_keys(vllm_python: Path) -> dict[str, set[str]]:
    proc = subprocess.run([str(vllm_python), "-c", PROBE], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return {k: set(v) for k, v in json.loads(proc.stdout.strip().splitlines()[-1]).items()}


def test_every_key_vllm_renders_is_in_the_digest(vllm_keys: dict[str, set[str]]) -> None:
    assert vllm_keys["rendered"] == set(MESSAGE_KEYS)
    assert vllm_keys["accepted"] <= set(MESSAGE_KEYS)


def test_only_reply_keys_vllm_never_renders_are_dropped(vllm_keys: dict[str, set[str]]) -> None:
    assert not DECORATION_KEYS & vllm_keys["rendered"]
    assert vllm_keys["reply"] <= set(MESSAGE_KEYS) | DECORATION_KEYS  # a reply echoed back stays comparable

"""Deterministic "sampling": the reply is a pure function of the prompt tokens.

Replies are words from a fixed vocabulary, so their text re-tokenizes to the same ids (see tokenizer.py). Prefill's
single token equals decode's first token, as with greedy decoding on a real model.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from duplex_sidecars.sim.tokenizer import EOS, token_id

_SYLLABLES = ("ka", "lo", "mi", "nu", "pe", "ri", "so", "ta", "ve", "zu", "bo", "da", "fi", "gu", "ho", "je")
# 256 two-syllable words plus a few three-syllable ones: all \w+, lowercase, never a special token.
VOCAB: tuple[str, ...] = tuple(a + b for a, b in itertools.product(_SYLLABLES, repeat=2)) + tuple(
    a + b + c for a, b, c in itertools.islice(itertools.product(_SYLLABLES, repeat=3), 0, 4096, 17)
)
_WORD_BY_ID = {token_id(w): w for w in VOCAB}
_VOCAB_IDS = tuple(token_id(w) for w in VOCAB)

# Bounds of the reply length when the request does not cap it (then the reply ends with EOS: finish_reason "stop").
MIN_NATURAL_LEN = 16
MAX_NATURAL_LEN = 64


def _seed(prompt: Sequence[int]) -> bytes:
    h = hashlib.blake2b(digest_size=16, person=b"duplex-sim-gen")
    h.update(np.asarray(prompt, dtype="<u4").tobytes())
    return h.digest()


def natural_length(prompt: Sequence[int]) -> int:
    """How many words the model "wants" to say before EOS."""
    span = MAX_NATURAL_LEN - MIN_NATURAL_LEN + 1
    return MIN_NATURAL_LEN + int.from_bytes(_seed(prompt)[:4], "little") % span


def word_at(seed: bytes, i: int) -> int:
    digest = hashlib.blake2b(i.to_bytes(4, "little"), digest_size=4, key=seed).digest()
    return _VOCAB_IDS[int.from_bytes(digest, "little") % len(_VOCAB_IDS)]


@dataclass(frozen=True)
class Reply:
    """The sampled tokens (EOS included when the reply stopped) and why generation ended."""

    tokens: tuple[int, ...]
    finish_reason: str  # "stop" | "length"

    @property
    def visible(self) -> tuple[int, ...]:
        """The tokens the client sees (EOS is not rendered)."""
        return self.tokens[:-1] if self.finish_reason == "stop" else self.tokens


def reply(prompt: Sequence[int], max_tokens: int | None, min_tokens: int = 0, ignore_eos: bool = False) -> Reply:
    """The deterministic reply to `prompt` under vLLM's length rules (EOS counts as a generated token)."""
    words = max(natural_length(prompt), min_tokens)
    if ignore_eos and max_tokens is not None:
        words = max_tokens
    seed = _seed(prompt)
    if max_tokens is not None and max_tokens <= words:
        return Reply(tuple(word_at(seed, i) for i in range(max_tokens)), "length")
    return Reply(tuple(word_at(seed, i) for i in range(words)) + (EOS,), "stop")


def word(tok: int) -> str:
    """The text of a generated token; EOS and unknown ids render as nothing."""
    return _WORD_BY_ID.get(tok, "")


def chat_text(tokens: Sequence[int]) -> str:
    """Assistant message content: words joined by single spaces (round-trips through the tokenizer)."""
    return " ".join(w for w in map(word, tokens) if w)


def chat_delta(tokens_so_far: int, tok: int) -> str:
    """The streaming delta of the token at position `tokens_so_far` of a chat reply."""
    w = word(tok)
    return w if tokens_so_far == 0 or not w else " " + w


def completion_delta(tok: int) -> str:
    """A completion continues the prompt: every word carries its leading space so prompt + text re-tokenizes."""
    w = word(tok)
    return " " + w if w else ""

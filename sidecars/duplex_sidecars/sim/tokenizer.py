"""A deterministic stand-in tokenizer: words and punctuation, ids by a stable hash.

Whitespace is never a token, so text that the simulator generates (words joined by spaces) re-tokenizes to exactly
the token ids it was generated from, which keeps multi-turn prefixes stable the way a real BPE does for its own output.
"""

from __future__ import annotations

import functools
import hashlib
import re

# Special tokens used by the chat template; ids below FIRST_WORD_ID never collide with hashed words.
SPECIAL_TOKENS: dict[str, int] = {
    "<|im_start|>": 1,
    "<|im_end|>": 2,
    "<|name|>": 3,
    "<|tool_call|>": 4,
    "<|tool_call_id|>": 5,
    "<|tools|>": 6,
    "<|content|>": 7,
    "<|reasoning|>": 8,
}
IM_START = SPECIAL_TOKENS["<|im_start|>"]
IM_END = SPECIAL_TOKENS["<|im_end|>"]
# The end-of-turn token doubles as EOS, as in chatml models: it is sampled but never shown.
EOS = IM_END
FIRST_WORD_ID = 256
_ID_SPACE = 2**31 - FIRST_WORD_ID

# Specials first so that `<|im_end|>` is one token, then words, then single punctuation characters.
_TOKEN_RE = re.compile(r"<\|[a-z_]+\|>|\w+|[^\w\s]")
# Histories are resent every turn: texts up to this size are tokenized once and then looked up, as fast as a real
# (compiled) tokenizer, so that the simulator's own cost stays far below a router's.
_CACHED_TEXT_CHARS = 4096


@functools.lru_cache(maxsize=1 << 16)
def token_id(piece: str) -> int:
    """The stable id of one token string."""
    special = SPECIAL_TOKENS.get(piece)
    if special is not None:
        return special
    digest = hashlib.blake2b(piece.encode("utf-8"), digest_size=8).digest()
    return FIRST_WORD_ID + int.from_bytes(digest, "little") % _ID_SPACE


def split(text: str) -> list[str]:
    """The token strings of `text`."""
    return _TOKEN_RE.findall(text)


def tokenize(text: str) -> list[int]:
    """The token ids of `text`."""
    if len(text) > _CACHED_TEXT_CHARS:
        return [token_id(p) for p in split(text)]
    return list(_tokenize_cached(text))


@functools.lru_cache(maxsize=1024)  # with the id cache, ~32 MB when both are full
def _tokenize_cached(text: str) -> tuple[int, ...]:
    return tuple(token_id(p) for p in split(text))

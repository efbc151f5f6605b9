"""Deterministic replies under vLLM's length rules."""

from duplex_sidecars.sim import generation
from duplex_sidecars.sim.tokenizer import EOS, tokenize

PROMPT = tokenize("tell me about the sea")


def test_reply_is_a_function_of_the_prompt():
    assert generation.reply(PROMPT, 20) == generation.reply(list(PROMPT), 20)
    assert generation.reply(PROMPT, 20) != generation.reply(PROMPT + [7], 20)


def test_prefill_token_is_decodes_first_token():
    assert generation.reply(PROMPT, 1).tokens[0] == generation.reply(PROMPT, None).tokens[0]


def test_uncapped_reply_stops_with_eos():
    r = generation.reply(PROMPT, None)
    assert r.finish_reason == "stop" and r.tokens[-1] == EOS
    assert generation.MIN_NATURAL_LEN <= len(r.visible) <= generation.MAX_NATURAL_LEN
    assert EOS not in r.visible


def test_cap_below_natural_length_is_length():
    n = generation.natural_length(PROMPT)
    assert generation.reply(PROMPT, n).finish_reason == "length"
    assert len(generation.reply(PROMPT, n).tokens) == n
    longer = generation.reply(PROMPT, n + 5)
    assert longer.finish_reason == "stop" and len(longer.tokens) == n + 1


def test_ignore_eos_and_min_tokens():
    n = generation.natural_length(PROMPT)
    assert generation.reply(PROMPT, n + 10, ignore_eos=True) == generation.Reply(
        generation.reply(PROMPT, n + 10, ignore_eos=True).tokens, "length"
    )
    assert len(generation.reply(PROMPT, n + 10, ignore_eos=True).tokens) == n + 10
    assert len(generation.reply(PROMPT, None, min_tokens=n + 3).visible) == n + 3

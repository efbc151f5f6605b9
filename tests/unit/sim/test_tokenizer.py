"""The tokenizer and chat template: stable ids, and generated replies that round-trip into the next turn's prompt."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from duplex_sidecars.sim import generation
from duplex_sidecars.sim.chat_template import TemplateError, assistant_header, render_chat
from duplex_sidecars.sim.tokenizer import EOS, FIRST_WORD_ID, IM_END, split, token_id, tokenize

_text = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=80)
_role = st.sampled_from(["system", "user", "assistant", "tool"])
_message = st.fixed_dictionaries(
    {"role": _role, "content": _text},
    optional={
        "name": st.from_regex(r"[a-z_]{1,8}", fullmatch=True),
        "tool_call_id": st.from_regex(r"call_[0-9]{1,4}", fullmatch=True),
    },
)


def test_splits_words_and_punctuation_and_drops_whitespace():
    assert split("Hello, world!\n  <|im_end|>x") == ["Hello", ",", "world", "!", "<|im_end|>", "x"]


def test_ids_are_stable_and_specials_are_reserved():
    assert tokenize("a b a") == [token_id("a"), token_id("b"), token_id("a")]
    assert token_id("<|im_end|>") == IM_END < FIRST_WORD_ID <= token_id("im_end")


def test_generation_prompt_is_the_rendered_assistant_header():
    history = [{"role": "user", "content": "hi"}]
    with_prompt = render_chat(history)
    assert with_prompt == render_chat(history, add_generation_prompt=False) + assistant_header()


def test_tool_calls_ids_and_names_shape_the_prompt():
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
    base = [{"role": "user", "content": "weather?"}, {"role": "assistant", "content": None, "tool_calls": [call]}]
    tool = {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "sunny"}
    a = render_chat(base + [tool])
    assert a == render_chat(base + [dict(tool)])  # deterministic
    assert a != render_chat(base + [{**tool, "tool_call_id": "call_2"}])
    assert a != render_chat(base + [{**tool, "name": "other"}])
    other_call = {**call, "function": {**call["function"], "arguments": '{"city": "Rome"}'}}
    assert a != render_chat([base[0], {**base[1], "tool_calls": [other_call]}, tool])
    assert render_chat(base, tools=[{"type": "function"}]) != render_chat(base)


def test_bad_messages_are_template_errors():
    for bad in (None, [], [{"content": "x"}], ["x"], [{"role": "user", "content": 3}]):
        with pytest.raises(TemplateError):
            render_chat(bad)


@settings(max_examples=150, deadline=None)
@given(
    history=st.lists(_message, min_size=1, max_size=4),
    max_tokens=st.one_of(st.none(), st.integers(1, 80)),
    follow_up=_text,
)
def test_generated_reply_round_trips_into_next_turn(history, max_tokens, follow_up):
    prompt = render_chat(history)
    reply = generation.reply(prompt, max_tokens)
    content = generation.chat_text(reply.tokens)
    # What the client sees, streamed or not, is the same text, and it re-tokenizes to the generated ids.
    assert "".join(generation.chat_delta(i, t) for i, t in enumerate(reply.tokens)) == content
    assert tokenize(content) == list(reply.visible)
    # Decode's KV covers prompt + reply minus the last sampled token; the next turn's prompt must start with it.
    next_prompt = render_chat(
        history + [{"role": "assistant", "content": content}, {"role": "user", "content": follow_up}]
    )
    kv_tokens = prompt + list(reply.tokens[:-1])
    assert next_prompt[: len(kv_tokens)] == kv_tokens
    if reply.finish_reason == "stop":
        assert reply.tokens[-1] == EOS and next_prompt[: len(prompt) + len(reply.tokens)] == prompt + list(reply.tokens)


@settings(max_examples=100, deadline=None)
@given(prompt=_text, max_tokens=st.integers(1, 50))
def test_completion_text_continues_the_prompt(prompt, max_tokens):
    ids = tokenize(prompt)
    reply = generation.reply(ids, max_tokens)
    text = "".join(generation.completion_delta(t) for t in reply.tokens)
    assert tokenize(prompt + text) == ids + list(reply.visible)


def test_remembered_tokenizations_are_copies_and_long_texts_agree():
    from duplex_sidecars.sim import tokenizer

    ids = tokenize("one two, three")
    ids.append(12345)  # the caller owns what it gets
    assert tokenize("one two, three") == [token_id("one"), token_id("two"), token_id(","), token_id("three")]
    long = "word " * (tokenizer._CACHED_TEXT_CHARS // 5 + 10) + "end."
    assert len(long) > tokenizer._CACHED_TEXT_CHARS
    assert tokenize(long) == [token_id(p) for p in split(long)]

"""vLLM's parse of chat messages: what reaches the template, and the prompt rendered from it."""

import pytest

from duplex_sidecars.sim.chat_parse import parse_message
from duplex_sidecars.sim.chat_template import TemplateError, assistant_header, render_conversation, render_message
from duplex_sidecars.sim.tokenizer import IM_END

CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"b": 1, "a": [2]}'}}


@pytest.mark.parametrize(
    ("message", "parsed"),
    [
        ({"role": "user", "content": "hi"}, {"role": "user", "content": "hi"}),
        ({"role": "user", "content": None}, {"role": "user", "content": ""}),
        # text-like parts of every API join with newlines; other keys never reach the template
        (
            {
                "role": "user",
                "type": "message",
                "id": "x",
                "status": "completed",
                "content": [
                    {"type": "input_text", "text": "a"},
                    {"type": "text", "text": "b"},
                    {"type": "output_text", "text": "c", "annotations": []},
                    "d",
                ],
            },
            {"role": "user", "content": "a\nb\nc\nd"},
        ),
        (
            {"role": "user", "content": [{"type": "text", "text": None}, {"type": "refusal", "refusal": "no"}]},
            {"role": "user", "content": "no"},
        ),
        (
            {
                "role": "user",
                "content": [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": "u"}}],
            },
            {
                "role": "user",
                "content": [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": "u"}}],
            },
        ),
        ({"role": "user", "content": "hi", "name": "bob"}, {"role": "user", "content": "hi", "name": "bob"}),
        ({"role": "user", "content": "hi", "name": 5}, {"role": "user", "content": "hi"}),
        # Claude Code's per-request attribution line is dropped from system text
        (
            {"role": "system", "content": "x-anthropic-billing-header: cch=1\nBe brief."},
            {"role": "system", "content": "Be brief."},
        ),
        (
            {
                "role": "system",
                "content": [
                    {"type": "text", "text": "x-anthropic-billing-header: cch=1"},
                    {"type": "text", "text": "kept"},
                ],
            },
            {"role": "system", "content": "kept"},
        ),
        (
            {"role": "user", "content": "x-anthropic-billing-header: stays for users"},
            {"role": "user", "content": "x-anthropic-billing-header: stays for users"},
        ),
        # tool calls get object arguments; bad JSON or a non-object becomes {}; an empty list disappears
        (
            {"role": "assistant", "content": None, "tool_calls": [CALL]},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{**CALL, "function": {"name": "f", "arguments": {"b": 1, "a": [2]}}}],
            },
        ),
        (
            {"role": "assistant", "tool_calls": [{**CALL, "function": {"name": "f", "arguments": "{oops"}}]},
            {"role": "assistant", "content": "", "tool_calls": [{**CALL, "function": {"name": "f", "arguments": {}}}]},
        ),
        (
            {"role": "assistant", "tool_calls": [{**CALL, "function": {"name": "f", "arguments": "[1]"}}]},
            {"role": "assistant", "content": "", "tool_calls": [{**CALL, "function": {"name": "f", "arguments": {}}}]},
        ),
        ({"role": "assistant", "content": "x", "tool_calls": []}, {"role": "assistant", "content": "x"}),
        (
            {"role": "assistant", "content": "x", "reasoning": "r"},
            {"role": "assistant", "content": "x", "reasoning": "r", "reasoning_content": "r"},
        ),
        (
            {"role": "user", "content": "x", "reasoning": "r", "tool_calls": [CALL], "tool_call_id": "c"},
            {"role": "user", "content": "x"},
        ),
        (
            {
                "role": "tool",
                "content": [{"type": "input_text", "text": "4"}, {"type": "text", "text": "2"}],
                "tool_call_id": "c1",
            },
            {"role": "tool", "content": "4\n2", "tool_call_id": "c1"},
        ),
        ({"role": "developer", "content": "d"}, {"role": "developer", "content": "d", "tools": None}),
    ],
)
def test_parse_keeps_what_reaches_the_template(message, parsed):
    assert parse_message(message) == parsed


@pytest.mark.parametrize(
    "message",
    [
        {"content": "no role"},
        {"role": "user", "content": 3},
        {"role": "user", "content": [{"text": "no type"}]},
        {"role": "user", "content": [{"type": "weird", "text": "x"}]},
        {"role": "user", "content": [{"type": "input_text"}]},
        {"role": "assistant", "tool_calls": ["x"]},
        {"role": "assistant", "tool_calls": [{"type": "custom", "function": {}}]},
    ],
)
def test_parse_refuses_what_vllm_refuses(message):
    with pytest.raises(TemplateError):
        parse_message(message)


def test_reasoning_and_message_tools_shape_the_prompt():
    base = {"role": "assistant", "content": "answer"}
    assert render_message({**base, "reasoning": "why"}) != render_message(base)
    assert render_message({"role": "user", "content": "q", "reasoning": "why"}) == render_message(
        {"role": "user", "content": "q"}
    )  # only an assistant's reasoning is rendered
    dev = {"role": "developer", "content": "d"}
    assert render_message({**dev, "tools": [{"name": "f"}]}) != render_message({**dev, "tools": None})


def test_continue_final_message_leaves_the_last_turn_open():
    history = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "ka lo"}]
    closed = render_conversation(history, add_generation_prompt=False)
    opened = render_conversation(history, add_generation_prompt=False, continue_final_message=True)
    assert closed[-1] == IM_END and opened == closed[:-1]
    # An open assistant turn continues exactly where a generation prompt plus the reply would have got to.
    prompt = render_conversation(history[:1])
    assert prompt[-2:] == assistant_header() and opened == prompt + closed[len(prompt) : -1]
    assert render_conversation([]) == assistant_header()

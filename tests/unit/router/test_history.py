"""The covered-history digest: a history extended by new turns matches; any edit, truncation, reordering, changed
tool call or different scope does not."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from duplex_sidecars.router.history import (
    ANONYMOUS_TENANT,
    CHAT_ROUTE,
    COMPLETIONS_ROUTE,
    History,
    Reply,
    header_tenant,
    key_tenant,
    normalize_message,
    reply_not_storable,
    request_not_storable,
    scope_digest,
    state_key,
)

text = st.text(min_size=0, max_size=30)
tool_call = st.fixed_dictionaries(
    {
        "id": st.text(min_size=1, max_size=8),
        "type": st.just("function"),
        "function": st.fixed_dictionaries({"name": st.text(min_size=1, max_size=8), "arguments": text}),
    }
)
message = st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["system", "user"]), "content": text}),
    st.fixed_dictionaries({"role": st.just("assistant"), "content": text}),
    st.fixed_dictionaries(
        {"role": st.just("assistant"), "content": st.none(), "tool_calls": st.lists(tool_call, min_size=1, max_size=3)}
    ),
    st.fixed_dictionaries({"role": st.just("tool"), "tool_call_id": st.text(min_size=1, max_size=8), "content": text}),
    st.fixed_dictionaries(
        {
            "role": st.just("user"),
            "content": st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": text}), min_size=1, max_size=3),
        }
    ),
)
messages = st.lists(message, min_size=1, max_size=8)
reply = st.builds(
    lambda c, calls: Reply(content=c, tool_calls=tuple(calls), finish_reason="stop"),
    st.one_of(st.none(), text),
    st.lists(tool_call, max_size=2),
)


def chat(msgs):
    return History.of_request(CHAT_ROUTE, {"messages": msgs})


def assistant_of(r: Reply) -> dict:
    out = {"role": "assistant", "content": r.content}
    if r.tool_calls:
        out["tool_calls"] = list(r.tool_calls)
    return out


@given(messages, reply, st.lists(message, max_size=4))
def test_extended_history_matches(msgs, r, new_turns):
    covered = chat(msgs).covered_with(r)
    next_msgs = msgs + [assistant_of(r)] + new_turns
    assert chat(next_msgs).matches(covered)


@given(messages, reply)
def test_sdk_echo_decorations_still_match(msgs, r):
    covered = chat(msgs).covered_with(r)
    echoed = {
        **assistant_of(r),
        "refusal": None,
        "annotations": [],
        "audio": None,
        "function_call": None,
        "reasoning_content": None,
    }
    if r.tool_calls:
        echoed["tool_calls"] = [{**c, "index": i} for i, c in enumerate(r.tool_calls)]
        echoed["content"] = "" if r.content is None else r.content
    assert chat(msgs + [echoed, {"role": "user", "content": "next"}]).matches(covered)


@given(messages, reply, st.data())
def test_any_edit_of_a_message_breaks_the_match(msgs, r, data):
    covered = chat(msgs).covered_with(r)
    full = msgs + [assistant_of(r)]
    i = data.draw(st.integers(0, len(full) - 1))
    edited = copy.deepcopy(full)
    target = edited[i]
    if target.get("tool_calls"):
        j = data.draw(st.integers(0, len(target["tool_calls"]) - 1))
        field = data.draw(st.sampled_from(["id", "name", "arguments"]))
        if field == "id":
            target["tool_calls"][j]["id"] += "x"
        else:
            target["tool_calls"][j]["function"][field] += "x"
    elif isinstance(target.get("content"), list):
        target["content"][0]["text"] += "x"
    else:
        target["content"] = (target.get("content") or "") + "x"
    assert not chat(edited + [{"role": "user", "content": "next"}]).matches(covered)


@given(messages, reply, st.data())
def test_changed_role_breaks_the_match(msgs, r, data):
    covered = chat(msgs).covered_with(r)
    full = msgs + [assistant_of(r)]
    i = data.draw(st.integers(0, len(full) - 1))
    new_role = data.draw(st.sampled_from(["system", "user", "assistant", "tool", "developer"]))
    assume(new_role != full[i]["role"])
    full[i] = {**full[i], "role": new_role}
    assert not chat(full).matches(covered)


@given(messages, reply, st.data())
def test_truncation_breaks_the_match(msgs, r, data):
    covered = chat(msgs).covered_with(r)
    full = msgs + [assistant_of(r)]
    cut = data.draw(st.integers(0, len(full) - 1))
    truncated = full[:cut]
    assert truncated == [] or not chat(truncated).matches(covered)
    # dropping a message from the middle is a truncation too
    k = data.draw(st.integers(0, len(full) - 1))
    dropped = full[:k] + full[k + 1 :] + [{"role": "user", "content": "next"}]
    if dropped[: len(full)] != full:
        assert not chat(dropped).matches(covered)


@given(messages, reply, st.data())
def test_reordering_breaks_the_match(msgs, r, data):
    covered = chat(msgs).covered_with(r)
    full = msgs + [assistant_of(r)]
    i = data.draw(st.integers(0, len(full) - 1))
    j = data.draw(st.integers(0, len(full) - 1))
    swapped = list(full)
    swapped[i], swapped[j] = swapped[j], swapped[i]
    assume(normalize_message(swapped[i]) != normalize_message(swapped[j]))
    assert not chat(swapped + [{"role": "user", "content": "next"}]).matches(covered)


@given(messages, reply)
def test_the_generated_reply_must_be_there(msgs, r):
    covered = chat(msgs).covered_with(r)
    assert not chat(msgs + [{"role": "user", "content": "next"}]).matches(covered) or (
        normalize_message({"role": "user", "content": "next"}) == normalize_message(assistant_of(r))
    )


scope_fields = st.sampled_from(
    [
        "tools",
        "tool_choice",
        "chat_template",
        "chat_template_kwargs",
        "add_generation_prompt",
        "continue_final_message",
        "add_special_tokens",
        "documents",
        "cache_salt",
        "reasoning_effort",
        "response_format",
        "model",
    ]
)


@given(scope_fields, st.one_of(st.text(max_size=5), st.booleans(), st.dictionaries(st.text(max_size=3), st.integers())))
def test_scope_changes_with_every_tokenization_field(field, value):
    base = {"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 5, "temperature": 0.3}
    changed = {**base, field: value}
    assume(base.get(field) != value)
    assert scope_digest(CHAT_ROUTE, base) != scope_digest(CHAT_ROUTE, changed)


def test_scope_ignores_sampling_and_the_route_matters():
    base = {"model": "m", "max_tokens": 5}
    assert scope_digest(CHAT_ROUTE, base) == scope_digest(
        CHAT_ROUTE, {**base, "temperature": 1, "stream": True, "max_tokens": 9, "seed": 3}
    )
    assert scope_digest(CHAT_ROUTE, base) != scope_digest(COMPLETIONS_ROUTE, base)
    assert scope_digest(CHAT_ROUTE, {**base, "tools": None}) == scope_digest(CHAT_ROUTE, base)


@given(st.text(min_size=1, max_size=40), st.text(max_size=40), st.text(max_size=40))
def test_completion_prompts_must_extend_prompt_plus_reply(prompt, generated, more):
    covered = History.of_request(COMPLETIONS_ROUTE, {"prompt": prompt}).covered_with(
        Reply(content=generated, finish_reason="length")
    )
    assert History.of_request(COMPLETIONS_ROUTE, {"prompt": prompt + generated + more}).matches(covered)
    if generated:
        assert not History.of_request(COMPLETIONS_ROUTE, {"prompt": prompt + more}).matches(covered) or more.startswith(
            generated
        )
    edited = "X" + prompt[1:] if prompt[0] != "X" else "Y" + prompt[1:]
    assert not History.of_request(COMPLETIONS_ROUTE, {"prompt": edited + generated + more}).matches(covered)


def test_chat_and_completion_histories_never_match_each_other():
    chat_cov = chat([{"role": "user", "content": "a"}]).covered_with(Reply(content="b", finish_reason="stop"))
    assert not History.of_request(COMPLETIONS_ROUTE, {"prompt": "ab" * 100}).matches(chat_cov)


def test_uncomparable_requests_have_no_history():
    assert History.of_request(COMPLETIONS_ROUTE, {"prompt": [1, 2, 3]}) is None
    assert History.of_request(COMPLETIONS_ROUTE, {"prompt": ""}) is None
    assert History.of_request(CHAT_ROUTE, {"messages": []}) is None
    assert (
        History.of_request(
            CHAT_ROUTE,
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "image_url", "image_url": {"url": "https://example.invalid/cat.png"}}],
                    }
                ]
            },
        )
        is None
    )
    inline = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    assert History.of_request(CHAT_ROUTE, {"messages": [{"role": "user", "content": [inline]}]}) is not None


def test_tool_only_turn_content_null_or_empty_is_the_same():
    call = {"id": "1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    a = normalize_message({"role": "assistant", "content": None, "tool_calls": [call]})
    b = normalize_message({"role": "assistant", "content": "", "tool_calls": [{**call, "index": 0}]})
    assert a == b
    assert normalize_message({"role": "assistant", "content": ""}) != normalize_message({"role": "assistant"})


def test_keys_are_tenant_model_and_conversation_scoped_and_hashed():
    t = header_tenant(["Bearer secret"])
    assert "secret" not in t and t != ANONYMOUS_TENANT and header_tenant([None, None]) == ANONYMOUS_TENANT
    keys = {
        state_key(t, "m", "c"),
        state_key(header_tenant(["Bearer other"]), "m", "c"),
        state_key(t, "m2", "c"),
        state_key(t, "m", "c2"),
        state_key(ANONYMOUS_TENANT, "m", "c"),
    }
    assert len(keys) == 5
    assert all(len(k) == 64 for k in keys)


def test_header_tenants_cannot_alias_a_client_key_tenant_or_each_other():
    # Before: a key tenant was the digest of "client\0" + name and a header tenant that of its values joined by NUL,
    # so the headers ("client", "alice") named the tenant of the key called alice.
    assert header_tenant(["client", "alice"]) != key_tenant("alice")
    assert header_tenant(["a\0b", ""]) != header_tenant(["a", "b"])
    assert header_tenant(["x", None]) == header_tenant(["x", ""]) != header_tenant(["", "x"])


@settings(max_examples=50)
@given(st.text(max_size=10), st.text(max_size=10), st.text(max_size=10))
def test_state_keys_do_not_collide_on_separators(a, b, c):
    assume(b != "")
    assert state_key(a, b, c) != state_key(a + b, "", c)


def test_what_cannot_be_stored():
    assert request_not_storable(CHAT_ROUTE, {"n": 2})
    assert request_not_storable(COMPLETIONS_ROUTE, {"echo": True})
    assert request_not_storable(CHAT_ROUTE, {"continue_final_message": True})
    assert request_not_storable(CHAT_ROUTE, {"n": 1}) is None
    ok = Reply(content="x", finish_reason="stop")
    assert reply_not_storable({}, ok) is None
    assert reply_not_storable({}, Reply(content="x", finish_reason="length")) is None
    assert reply_not_storable({}, Reply(content="x", finish_reason="abort"))
    assert reply_not_storable({}, Reply(content="x", finish_reason=None))
    assert reply_not_storable({}, Reply(content="x", finish_reason="stop", choices=2))
    assert reply_not_storable({"stop": ["##"]}, Reply(content="x", finish_reason="stop", stop_reason="##"))
    assert reply_not_storable({"stop": ["##"]}, Reply(content="x", finish_reason="stop", stop_reason=None))
    assert reply_not_storable({"stop": ["##"]}, Reply(content="x", finish_reason="stop", stop_reason=2)) is None
    assert reply_not_storable({"stop": ["##"]}, Reply(content="x", finish_reason="length")) is None


@given(messages, reply, st.lists(st.integers(0, 10), max_size=6))
def test_digests_do_not_depend_on_what_was_asked_before(msgs, r, lengths):
    # A history keeps a running hash between the reuse check and the record; any order of questions gives the
    # answers a fresh history gives.
    h = chat(msgs)
    for n in lengths:
        assert h.prefix_digest(n) == chat(msgs).prefix_digest(n)
    assert h.covered_with(r) == chat(msgs).covered_with(r)
    for n in reversed(lengths):
        assert h.prefix_digest(n) == chat(msgs).prefix_digest(n)


@given(messages, st.randoms(use_true_random=False))
def test_equal_content_gives_equal_digests_whatever_the_key_order(msgs, rnd):
    def shuffled(obj):
        if isinstance(obj, dict):
            items = list(obj.items())
            rnd.shuffle(items)
            return {k: shuffled(v) for k, v in items}
        if isinstance(obj, list):
            return [shuffled(v) for v in obj]
        return obj

    reordered = shuffled(msgs)
    assert chat(reordered).prefix_digest(len(msgs)) == chat(msgs).prefix_digest(len(msgs))
    body = {"model": "m", "tools": [{"type": "function", "function": {"name": "f", "parameters": {"a": 1, "b": 2}}}]}
    assert scope_digest(CHAT_ROUTE, shuffled(body)) == scope_digest(CHAT_ROUTE, body)


def test_digests_are_versioned_and_stable():
    import hashlib

    from duplex_sidecars.router.history import DIGEST_VERSION

    # Spelled out byte for byte: a change to these bytes needs a new DIGEST_VERSION (Redis entries outlive a rollout).
    assert DIGEST_VERSION == 2

    def framed(*parts: bytes) -> bytes:
        return b"".join(len(p).to_bytes(8, "big") + p for p in parts)

    assert (
        state_key("anonymous", "m", "c1") == hashlib.sha256(b"conv/2\0" + framed(b"anonymous", b"m", b"c1")).hexdigest()
    )
    covered = chat([{"content": "hi", "role": "user"}]).covered_with(Reply(content="hello", finish_reason="stop"))
    assert (
        covered.digest
        == hashlib.sha256(
            b"messages/2\0" + framed(b'{"content":"hi","role":"user"}', b'{"content":"hello","role":"assistant"}')
        ).hexdigest()
    )
    assert (
        scope_digest(CHAT_ROUTE, {"tools": [{"x": 1.5, "é": None}], "model": "m"})
        == hashlib.sha256(
            b"scope/2\0" + '{"model":"m","route":"chat","tools":[{"x":1.5,"é":null}]}'.encode()
        ).hexdigest()
    )


def test_integers_beyond_64_bits_and_lone_surrogates_still_have_a_digest():
    big = {"model": "m", "tools": [{"maximum": 2**70}]}
    assert scope_digest(CHAT_ROUTE, big) != scope_digest(CHAT_ROUTE, {"model": "m", "tools": [{"maximum": 2**64}]})
    odd = chat([{"role": "user", "content": "a\ud800b"}])
    assert odd is not None and odd.prefix_digest(1) != chat([{"role": "user", "content": "ab"}]).prefix_digest(1)


def test_keys_vllm_renders_are_digested_and_unknown_keys_fail_closed():
    def digest(messages: list[dict[str, Any]]) -> str | None:
        history = History.of_request(CHAT_ROUTE, {"messages": messages})
        return None if history is None else history.prefix_digest(len(history))

    base = [{"role": "developer", "content": "be brief"}, {"role": "user", "content": "hi"}]
    with_tools = [{**base[0], "tools": [{"type": "function", "function": {"name": "f"}}]}, base[1]]
    with_task = [base[0], {**base[1], "task": "summarize"}]
    assert digest(base) is not None
    for variant in (with_tools, with_task):  # before: dropped from the digest, so a changed prompt matched
        assert digest(variant) not in (None, digest(base))
    assert digest([base[0], {**base[1], "refusal": None, "annotations": []}]) == digest(base)
    assert digest([base[0], {**base[1], "x_rendered_someday": "?"}]) is None  # uncomparable: a miss, not a guess

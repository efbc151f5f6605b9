"""vLLM's 400 bodies and pydantic's lax field reading. The expected strings are what vLLM 0.33's FastAPI app
answered for the same bodies (its validation handler, run in the vLLM virtualenv)."""

import pytest

from duplex_sidecars.sim import validation as v


def test_a_missing_field_is_reported_as_fastapi_does():
    f = v.Fields({})
    f.required("input")
    with pytest.raises(v.RequestError) as info:
        f.check()
    assert info.value.openai_body() == {
        "error": {
            "message": "1 validation error:\n  {'type': 'missing', 'loc': 'body.input', 'msg': 'Field required', "
            "'input': '<dict of 0 items>'}",
            "type": "Bad Request",
            "param": "body.input",
            "code": 400,
        }
    }


def test_several_errors_and_summarised_inputs():
    f = v.Fields({"input": 5, "max_output_tokens": "a"})
    f.fail(("input",), "string_type", "Input should be a valid string", 5)
    f.fail(("input",), "list_type", "Input should be a valid list", 5)
    f.integer("max_output_tokens")
    err = v.validation_failed(f.errors)
    assert err.message == (
        "3 validation errors:\n"
        "  {'type': 'string_type', 'loc': 'body.input', 'msg': 'Input should be a valid string', 'input': '5'}\n"
        "  {'type': 'list_type', 'loc': 'body.input', 'msg': 'Input should be a valid list', 'input': '5'}\n"
        "  {'type': 'int_parsing', 'loc': 'body.max_output_tokens', 'msg': 'Input should be a valid integer, unable "
        "to parse string as an integer', 'input': 'a'}"
    )
    assert err.param == "body.input"
    many = v.validation_failed([v.FieldError("missing", ("body", str(i)), "Field required", None) for i in range(12)])
    assert many.message.endswith("  ...and 2 more errors") and many.message.count("'missing'") == 10


def test_value_errors_carry_their_exception():
    err = v.validation_failed(
        [
            v.FieldError(
                "value_error",
                ("body", "max_tokens"),
                "Value error, max_tokens must be positive",
                0,
                {"error": ValueError("max_tokens must be positive")},
            )
        ]
    )
    assert err.message == (
        "1 validation error:\n  {'type': 'value_error', 'loc': 'body.max_tokens', 'msg': 'Value error, max_tokens "
        "must be positive', 'input': '0', 'ctx': {'error': ValueError('max_tokens must be positive')}}"
    )


def test_vllm_validation_errors_name_their_parameter():
    err = v.invalid("prompt template is not supported", "prompt")
    assert err.openai_body()["error"] == {
        "message": "prompt template is not supported (parameter=prompt)",
        "type": "BadRequestError",
        "param": "prompt",
        "code": 400,
    }
    assert v.invalid("max_tokens must be at least 1, got 0.", "max_tokens", 0).message == (
        "max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)"
    )


def test_messages_are_sanitized():
    assert v.sanitize_message("bad file /root/x/y.py at <obj at 0xdeadbeef>") == "bad file <path> at <obj>"


@pytest.mark.parametrize(
    ("reader", "value", "expected"),
    [
        (v.lax_int, 3, 3),
        (v.lax_int, True, 1),
        (v.lax_int, 2.0, 2),
        (v.lax_int, " 7 ", 7),
        (v.lax_bool, "yes", True),
        (v.lax_bool, "Off", False),
        (v.lax_bool, 1, True),
        (v.lax_bool, 0.0, False),
        (v.lax_float, 1, 1.0),
        (v.lax_float, "0.5", 0.5),
        (v.strict_str, "s", "s"),
        (v.strict_dict, {}, {}),
    ],
)
def test_lax_readers_coerce(reader, value, expected):
    assert reader(value) == expected and type(reader(value)) is type(expected)


@pytest.mark.parametrize(
    ("reader", "value", "error"),
    [
        (v.lax_int, 1.5, "int_from_float"),
        (v.lax_int, "a", "int_parsing"),
        (v.lax_int, [1], "int_type"),
        (v.lax_bool, "maybe", "bool_parsing"),
        (v.lax_bool, 2, "bool_type"),
        (v.lax_float, "x", "float_parsing"),
        (v.strict_str, 1, "string_type"),
        (v.strict_dict, [], "dict_type"),
        (v.strict_list, {}, "list_type"),
    ],
)
def test_lax_readers_refuse(reader, value, error):
    with pytest.raises(v.LaxError) as info:
        reader(value)
    assert info.value.type == error


def test_literals_are_worded_as_pydantic_words_them():
    f = v.Fields({"role": "tool"})
    assert f.literal("role", ("user", "assistant", "system")) is None
    assert f.errors[0].msg == "Input should be 'user', 'assistant' or 'system'"

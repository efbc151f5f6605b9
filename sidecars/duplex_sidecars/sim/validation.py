"""Request validation as vLLM's FastAPI layer reports it: pydantic's lax reading of body fields, the 400 body of a
RequestValidationError, and the errors its serving code raises (VLLMValidationError and friends).

vLLM answers these in the OpenAI shape `{"error": {"message", "type", "param", "code"}}`, also on /v1/messages when
the body fails validation (the app-wide handler, serve/exception_handling/handlers/validation.py); the Messages route
turns only the errors of its own handler into Anthropic's shape.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

_MAX_REPORTED_ERRORS = 10
_MAX_ERROR_INPUT_CHARS = 200
_MAX_ERROR_CHARS = 1000
_TRUE = frozenset({"1", "on", "t", "true", "y", "yes"})
_FALSE = frozenset({"0", "off", "f", "false", "n", "no"})


class RequestError(Exception):
    """An answer given before the request reaches the engine (or instead of its output)."""

    def __init__(self, status: int, message: str, type_: str, param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param = status, sanitize_message(message), type_, param

    def openai_body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.status}}


def sanitize_message(message: str) -> str:
    """vLLM strips memory addresses and paths from every error message (exception_handling/utils.py)."""
    message = re.sub(r" at 0x[0-9a-fA-F]+>", ">", message)
    message = re.sub(r"/(?:home|usr|opt|var|tmp|root|lib|mnt|srv)(?:/[\w.\-]+)+", "<path>", message)
    message = re.sub(r"(?:/[\w\-]+)+/[\w\-]+\.\w+", "<path>", message)
    return message.strip()


def invalid(message: str, parameter: str | None = None, value: Any = None) -> RequestError:
    """A VLLMValidationError as vLLM answers it: 400 BadRequestError, the parameter (and value) in the message."""
    extras = [f"parameter={parameter}"] if parameter is not None else []
    if value is not None:
        extras.append(f"value={value}")
    text = f"{message} ({', '.join(extras)})" if extras else message
    return RequestError(400, text, "BadRequestError", parameter)


def json_response(obj: Any, status: int = 200) -> web.Response:
    """JSON as Starlette's JSONResponse writes it: compact, UTF-8, non-ASCII unescaped."""
    return web.Response(body=orjson.dumps(obj), status=status, content_type="application/json")


def openai_error(error: RequestError) -> web.Response:
    return json_response(error.openai_body(), error.status)


def _summarize(value: Any) -> Any:
    if isinstance(value, str):
        return value if len(value) <= _MAX_ERROR_INPUT_CHARS else value[:_MAX_ERROR_INPUT_CHARS] + "...[truncated]"
    if isinstance(value, (list, tuple, dict)):
        return f"<{type(value).__name__} of {len(value)} items>"
    text = str(value) if value is not None else "None"
    return text if len(text) <= _MAX_ERROR_INPUT_CHARS else text[:_MAX_ERROR_INPUT_CHARS] + "...[truncated]"


@dataclass
class FieldError:
    """One pydantic error entry (type, loc, msg, input, ctx), printed as FastAPI's handler prints it."""

    type: str
    loc: tuple[str | int, ...]
    msg: str
    input: Any
    ctx: dict[str, Any] | None = None

    def describe(self) -> str:
        entry: dict[str, Any] = {
            "type": self.type,
            "loc": ".".join(map(str, self.loc)),
            "msg": self.msg,
            "input": _summarize(self.input),
        }
        if self.ctx is not None:
            entry["ctx"] = self.ctx
        text = str(entry)
        return text if len(text) <= _MAX_ERROR_CHARS else text[:_MAX_ERROR_CHARS] + "...[truncated]"


def validation_failed(errors: Sequence[FieldError]) -> RequestError:
    """The body of FastAPI's RequestValidationError as vLLM's handler writes it."""
    label = "error" if len(errors) == 1 else "errors"
    message = f"{len(errors)} validation {label}:\n"
    message += "".join(f"  {e.describe()}\n" for e in errors[:_MAX_REPORTED_ERRORS])
    if len(errors) > _MAX_REPORTED_ERRORS:
        message += f"  ...and {len(errors) - _MAX_REPORTED_ERRORS} more {label}\n"
    param = ".".join(map(str, errors[0].loc)) if errors else None
    return RequestError(400, message.rstrip(), "Bad Request", param)


async def read_json_object(request: web.Request) -> dict[str, Any]:
    """The request body as FastAPI hands it to a pydantic model: JSON only (validate_json_request), an object."""
    if request.content_type != "application/json":
        raise RequestError(
            400, "1 validation error:\n  Unsupported Media Type: Only 'application/json' is allowed", "Bad Request"
        )
    raw = await request.read()
    if not raw:
        raise validation_failed([FieldError("missing", ("body",), "Field required", None)])
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        try:  # the standard library's message and position, as FastAPI reports them
            body = json.loads(raw)
        except json.JSONDecodeError as e:
            raise validation_failed(
                [FieldError("json_invalid", ("body", e.pos), "JSON decode error", {}, {"error": e.msg})]
            ) from e
        except UnicodeDecodeError as e:
            raise validation_failed([FieldError("json_invalid", ("body", 0), "JSON decode error", {})]) from e
    if not isinstance(body, dict):
        raise validation_failed(
            [
                FieldError(
                    "model_attributes_type",
                    ("body",),
                    "Input should be a valid dictionary or object to extract fields from",
                    body,
                )
            ]
        )
    return body


@dataclass
class Fields:
    """Reads body fields with pydantic's lax rules (an int may come as 1.0 or "1", a bool as "yes"), collecting
    errors the way FastAPI reports them."""

    body: dict[str, Any]
    errors: list[FieldError] = field(default_factory=list)

    def fail(self, loc: tuple[str | int, ...], type_: str, msg: str, value: Any, ctx: Any = None) -> None:
        self.errors.append(FieldError(type_, ("body", *loc), msg, value, ctx))

    def string_branch_failed(self, since: int, loc: tuple[str | int, ...], value: Any) -> None:
        """For a `str | list[...]` field whose list failed after error number `since`: pydantic tries the string
        first, so its error comes first (and gives the 400 its param)."""
        if len(self.errors) > since:
            self.errors.insert(
                since, FieldError("string_type", ("body", *loc), "Input should be a valid string", value)
            )

    def check(self) -> None:
        if self.errors:
            raise validation_failed(self.errors)

    def has(self, name: str) -> bool:
        return name in self.body

    def raw(self, name: str, default: Any = None) -> Any:
        return self.body.get(name, default)

    def required(self, name: str) -> bool:
        if name not in self.body:
            self.fail((name,), "missing", "Field required", self.body)
            return False
        return True

    # -- readers: the value (coerced), or None after recording an error; None passes where `nullable` -----------
    def integer(self, name: str, default: Any = None, nullable: bool = True) -> Any:
        return self._coerce(self.body.get(name, default), (name,), lax_int, nullable)

    def number(self, name: str, default: Any = None, nullable: bool = True) -> Any:
        return self._coerce(self.body.get(name, default), (name,), lax_float, nullable)

    def boolean(self, name: str, default: Any = None, nullable: bool = True) -> Any:
        return self._coerce(self.body.get(name, default), (name,), lax_bool, nullable)

    def string(self, name: str, default: Any = None, nullable: bool = True) -> Any:
        return self._coerce(self.body.get(name, default), (name,), strict_str, nullable)

    def mapping(self, name: str, default: Any = None, nullable: bool = True) -> Any:
        return self._coerce(self.body.get(name, default), (name,), strict_dict, nullable)

    def array(self, name: str, default: Any = None, nullable: bool = True) -> Any:
        return self._coerce(self.body.get(name, default), (name,), strict_list, nullable)

    def literal(self, name: str, choices: tuple[Any, ...], default: Any = None, nullable: bool = True) -> Any:
        value = self.body.get(name, default)
        if value is None and nullable:
            return None
        if value not in choices:
            expected = _expected(choices)
            self.fail((name,), "literal_error", f"Input should be {expected}", value, {"expected": expected})
            return default
        return value

    def _coerce(self, value: Any, loc: tuple[Any, ...], reader: Any, nullable: bool) -> Any:
        if value is None and nullable:
            return None
        try:
            return reader(value)
        except LaxError as e:
            self.fail(loc, e.type, e.msg, value)
            return None


def _expected(choices: tuple[Any, ...]) -> str:
    """pydantic's wording of a literal's choices: 'a', 'b' or 'c'."""
    quoted = [repr(c) for c in choices]
    return quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " or " + quoted[-1]


class LaxError(ValueError):
    def __init__(self, type_: str, msg: str):
        super().__init__(msg)
        self.type, self.msg = type_, msg


def lax_int(value: Any) -> int:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if value.is_integer():
            return int(value)
        raise LaxError("int_from_float", "Input should be a valid integer, got a number with a fractional part")
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            raise LaxError(
                "int_parsing", "Input should be a valid integer, unable to parse string as an integer"
            ) from None
    raise LaxError("int_type", "Input should be a valid integer")


def lax_float(value: Any) -> float:
    if isinstance(value, (bool, int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            raise LaxError(
                "float_parsing", "Input should be a valid number, unable to parse string as a number"
            ) from None
    raise LaxError("float_type", "Input should be a valid number")


def lax_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    if isinstance(value, str):
        raise LaxError("bool_parsing", "Input should be a valid boolean, unable to interpret input")
    raise LaxError("bool_type", "Input should be a valid boolean")


def strict_str(value: Any) -> str:
    if isinstance(value, str):
        return value
    raise LaxError("string_type", "Input should be a valid string")


def strict_dict(value: Any) -> dict[str, Any]:
    if isinstance(value, dict):
        return value
    raise LaxError("dict_type", "Input should be a valid dictionary")


def strict_list(value: Any) -> list[Any]:
    if isinstance(value, list):
        return value
    raise LaxError("list_type", "Input should be a valid list")

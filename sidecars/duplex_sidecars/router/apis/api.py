"""What declaring a client API takes (`Api`), and the field checks every API's bodies go through."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from duplex_sidecars.protocol import LegShape
from duplex_sidecars.router.history import Covered, History, Reply
from duplex_sidecars.router.relay import StreamShape

# (field, required, check, message, code): what a body must satisfy before anything reaches an engine; null counts
# as absent.
FieldCheck = tuple[str, bool, Callable[[Any], bool], str, str]


class Collector(Protocol):
    """Builds the reply from a stream's parsed events."""

    def add(self, event: dict[str, Any], exact: bool = True) -> None: ...

    def reply(self) -> Reply: ...


@dataclass(frozen=True)
class Api:
    route: str  # its name in metrics and in digests
    path: str
    checks: tuple[FieldCheck, ...]  # after the model's, in order
    legs: LegShape
    history: Callable[[dict[str, Any]], History | None]  # None: not comparable (token prompts, odd shapes, ...)
    scope_fields: tuple[str, ...]  # request fields that change tokenization
    not_storable: Callable[[dict[str, Any]], str | None]  # why a request's reply cannot be replayed
    reply_of_body: Callable[[dict[str, Any]], Reply]
    collector: Callable[[], Collector]
    stream: StreamShape
    error_body: Callable[[int, str, str, Any], bytes]  # (status, message, type, code) in the API's own shape
    # The history decode's blocks cover after the reply (OpenAI chat: the reply as an assistant message).
    covered: Callable[[History, Reply], Covered] = History.covered_with
    # Request headers beside conversation.tenant_header that scope state to a tenant (Anthropic's x-api-key).
    tenant_headers: tuple[str, ...] = ()


def is_int(value: Any) -> bool:
    """An integer that is not a bool (JSON true is not 1)."""
    return isinstance(value, int) and not isinstance(value, bool)


MODEL_CHECK: tuple[FieldCheck, ...] = (
    (
        "model",
        True,
        lambda v: isinstance(v, str) and bool(v),
        "'model' is required and must be a non-empty string.",
        "missing_model",
    ),
)


def check_fields(checks: tuple[FieldCheck, ...], body: dict[str, Any], error: Callable[[str, str], Exception]) -> None:
    """`error(message, code)` for the first field that fails its check."""
    for name, required, ok, message, code in checks:
        value = body.get(name)
        if value is None:
            if required:
                raise error(message, code)
        elif not ok(value):
            raise error(message, code)

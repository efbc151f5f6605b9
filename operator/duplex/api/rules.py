"""Cross-field rules written once: a CEL expression for admission and a Python predicate for offline validation.

Every rule carries the message both paths report, so `duplex render` fails with the words the API server uses.
Tests evaluate each rule both ways on the same inputs (in Python here, in CEL against the real API server).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, model_validator


@dataclass(frozen=True)
class Rule:
    cel: str
    message: str
    holds: Callable[[Any], bool]
    field_path: str | None = None  # e.g. ".extraArgs": where the API server reports the error

    def schema(self) -> dict[str, Any]:
        out: dict[str, Any] = {"rule": self.cel, "message": self.message}
        if self.field_path:
            out["fieldPath"] = self.field_path
        return out


class RuleViolation(ValueError):
    """A rule failed; `field_path` is relative to the model that owns the rule."""

    def __init__(self, rule: Rule) -> None:
        super().__init__(rule.message)
        self.rule = rule


class Checked(BaseModel):
    """Base of every API model: unknown fields rejected, and the class's RULES enforced after validation."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, validate_default=True)
    RULES: ClassVar[tuple[Rule, ...]] = ()

    @model_validator(mode="after")
    def _check_rules(self) -> Checked:
        for rule in type(self).RULES:
            if not rule.holds(self):
                raise RuleViolation(rule)
        return self

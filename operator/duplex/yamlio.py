"""Deterministic YAML in and out (block style, stable key order as built, no aliases)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import yaml


class _NoAliasDumper(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str_presenter(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_NoAliasDumper.add_representer(str, _str_presenter)


def dump_all(docs: Iterable[dict[str, Any]]) -> str:
    text: str = yaml.dump_all(list(docs), Dumper=_NoAliasDumper, sort_keys=False, default_flow_style=False, width=120)
    return text


def load_all(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d is not None]

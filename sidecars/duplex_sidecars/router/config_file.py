"""The router's effective configuration: the config file (YAML or JSON, the RouterConfig model) with command-line
flags laid over it, and change detection so the file can be reloaded while the router serves."""

from __future__ import annotations

import hashlib
import os
from typing import Any

import yaml

from duplex_sidecars.router.config import RouterConfig


class ConfigError(Exception):
    pass


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`over` laid on `base`: nested mappings merge, everything else (lists included) is replaced."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def parse_text(text: str, name: str = "config") -> dict[str, Any]:
    try:
        data = yaml.safe_load(text)  # JSON is YAML
    except yaml.YAMLError as exc:
        raise ConfigError(f"{name}: not valid YAML/JSON: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{name}: the top level must be a mapping")
    return data


def flag_overrides(
    prefill: list[str] | None = None,
    decode: list[str] | None = None,
    host: str | None = None,
    port: int | None = None,
    conversation_ttl: float | None = None,
    admin_port: int | None = None,
) -> dict[str, Any]:
    """The part of the config the command-line flags set. Engine URLs given as flags make the engine set static:
    discovery from the file is switched off."""
    over: dict[str, Any] = {}
    if prefill:
        over["prefill"] = list(prefill)
    if decode:
        over["decode"] = list(decode)
    if prefill or decode:
        over["discovery"] = None
    if host is not None:
        over["host"] = host
    if port is not None:
        over["port"] = port
    if admin_port is not None:
        over["admin_port"] = admin_port
    if conversation_ttl is not None:
        over["conversation"] = {"ttl_seconds": conversation_ttl}
    return over


class ConfigSource:
    """Loads the effective config and tells whether the file changed since the last load."""

    def __init__(self, path: str | None, overrides: dict[str, Any] | None = None):
        self.path = path
        self.overrides = overrides or {}
        self._seen: tuple[int, int] | None = None
        self._digest: str | None = None

    def _read(self) -> tuple[str, str]:
        assert self.path is not None
        try:
            with open(self.path, "rb") as f:
                raw = f.read()
        except OSError as exc:
            raise ConfigError(f"{self.path}: cannot read: {exc}") from exc
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ConfigError(f"{self.path}: not UTF-8: {exc}") from exc
        return text, hashlib.sha256(raw).hexdigest()

    def load(self) -> RouterConfig:
        data: dict[str, Any] = {}
        if self.path is not None:
            self._seen = self._stat()
            text, self._digest = self._read()
            data = parse_text(text, self.path)
        try:
            return RouterConfig.model_validate(deep_merge(data, self.overrides))
        except ValueError as exc:  # pydantic's ValidationError is a ValueError
            raise ConfigError(f"{self.path or 'flags'}: invalid router config:\n{exc}") from exc

    def _stat(self) -> tuple[int, int] | None:
        if self.path is None:
            return None
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size)

    def forget(self) -> None:
        """Count the file as never loaded: the next `changed` says it changed (a reload that failed to apply)."""
        self._seen = None
        self._digest = None

    def changed(self) -> bool:
        """Cheap check (stat) first; the content digest decides, so a touched but equal file is no change. A
        Kubernetes ConfigMap volume swaps a symlink, which changes the stat of the path we open."""
        if self.path is None:
            return False
        seen = self._stat()
        if seen is None or seen == self._seen:
            return False
        self._seen = seen
        try:
            _, digest = self._read()
        except ConfigError:
            return True  # let load() report it
        return digest != self._digest

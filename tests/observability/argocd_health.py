"""Run charts/duplex/files/argocd-health.lua in glua as Argo CD would: `obj` is the resource as a Lua table, the
script returns {status, message}. Also the captured fixtures, what each should yield, and the status shape that
the drift check compares."""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path
from typing import Any

from tooling import CHART, ROOT, glua, run

SCRIPT = CHART / "files" / "argocd-health.lua"
FIXTURES = ROOT / "tests" / "fixtures" / "dsv-status"
# fixture -> Argo CD health it must get
EXPECTED = {
    "created": "Progressing",  # just created: no status yet
    "healthy": "Healthy",
    "progressing": "Progressing",  # an engine roll that cannot finish (surge pod unschedulable)
    "degraded-invalid-spec": "Degraded",  # the operator refuses the spec
    "starting": "Progressing",  # decode pods on the current spec, not ready yet, within the progress deadline
    "degraded-role-not-ready": "Degraded",  # decode pods not ready past the progress deadline (unschedulable)
    "suspended": "Suspended",  # prefill scaled to zero
}
# Only what Argo CD's sandbox offers health scripts (base functions, table, string, math, and a safe os).
_SANDBOX = [
    "ipairs",
    "pairs",
    "next",
    "tostring",
    "tonumber",
    "type",
    "select",
    "error",
    "assert",
    "pcall",
    "unpack",
    "table",
    "string",
    "math",
]


def lua_literal(value: Any) -> str:
    if value is None:
        return "nil"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        assert not (isinstance(value, float) and (math.isnan(value) or math.isinf(value)))
        return repr(value)
    if isinstance(value, str):
        return '"' + "".join(c if c.isprintable() and c not in '"\\' else f"\\{ord(c):03d}" for c in value) + '"'
    if isinstance(value, list):
        return "{" + ", ".join(lua_literal(v) for v in value) + "}"
    return "{" + ", ".join(f"[{lua_literal(k)}] = {lua_literal(v)}" for k, v in value.items()) + "}"


def health(obj: dict[str, Any], extra_lua: str = "") -> tuple[str, str]:
    """Argo CD's verdict on `obj`: (status, message)."""
    env = ", ".join(f"{name} = {name}" for name in _SANDBOX)
    program = "\n".join(
        [
            f"local obj = {lua_literal(obj)}",
            f"local check = loadstring({lua_literal(SCRIPT.read_text())})",
            f"local sandbox = {{{env}, obj = obj}}",
            "setfenv(check, sandbox)",
            f"if {lua_literal(extra_lua)} ~= '' then local probe = loadstring({lua_literal(extra_lua)}); "
            "setfenv(probe, sandbox); probe() end",
            "local hs = check()",
            'print(hs.status .. "\\t" .. (hs.message or ""))',
        ]
    )
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
        f.write(program)
    try:
        out = run([glua(), f.name]).stdout
    finally:
        Path(f.name).unlink()
    status, _, message = out.strip().partition("\t")
    return status, message


def shape(obj: dict[str, Any]) -> dict[str, Any]:
    """What the health check depends on, without values that change run to run: the status keys and value types,
    and per condition its status and reason."""

    def walk(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: walk(v) for k, v in sorted(value.items())}
        if isinstance(value, list):
            return sorted({json.dumps(walk(v), sort_keys=True) for v in value})
        return type(value).__name__

    status = dict(obj.get("status") or {})
    conditions = status.pop("conditions", None)
    out: dict[str, Any] = {"status": walk(status)}
    if conditions is not None:
        out["conditions"] = {c["type"]: [c["status"], c.get("reason"), sorted(c)] for c in conditions}
    return out

"""A check's result and the preflight report: the human lines, the full JSON, and the compact termination message."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

Status = Literal["pass", "fail", "warn", "skip"]

REPORT_VERSION = 1

# The kubelet keeps at most 4096 bytes of a container's termination message (and 12 KiB across the pod); staying at
# half of that leaves the other containers their share and can never be truncated into invalid JSON.
TERMINATION_BUDGET = 2048


@dataclass(frozen=True)
class CheckResult:
    name: str
    status: Status
    value: str  # what was measured, short enough for one line
    message: str = ""  # fail/warn: what to fix; skip: why the check did not apply
    data: dict[str, Any] = field(default_factory=dict)  # the numbers behind `value`, for the full JSON

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "status": self.status, "value": self.value}
        if self.message:
            out["message"] = self.message
        if self.data:
            out["data"] = self.data
        return out


def passed(name: str, value: str, **data: Any) -> CheckResult:
    return CheckResult(name, "pass", value, data=data)


def failed(name: str, value: str, message: str, **data: Any) -> CheckResult:
    return CheckResult(name, "fail", value, message, data)


def warned(name: str, value: str, message: str, **data: Any) -> CheckResult:
    return CheckResult(name, "warn", value, message, data)


def skipped(name: str, value: str, why: str, **data: Any) -> CheckResult:
    return CheckResult(name, "skip", value, why, data)


@dataclass(frozen=True)
class Report:
    backend: str
    checks: list[CheckResult]
    strict: bool = False
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        bad: set[str] = {"fail", "warn"} if self.strict else {"fail"}
        return not any(c.status in bad for c in self.checks)

    def counts(self) -> dict[str, int]:
        out = {"pass": 0, "fail": 0, "warn": 0, "skip": 0}
        for c in self.checks:
            out[c.status] += 1
        return out

    def as_dict(self) -> dict[str, Any]:
        return {
            "version": REPORT_VERSION,
            "ok": self.ok,
            "backend": self.backend,
            "strict": self.strict,
            "counts": self.counts(),
            "elapsed_s": round(self.elapsed_s, 3),
            "checks": [c.as_dict() for c in self.checks],
        }

    def human_lines(self) -> list[str]:
        width = max((len(c.name) for c in self.checks), default=0)
        return [line for c in self.checks for line in check_lines(c, width)] + [summary_line(self)]


def check_lines(c: CheckResult, width: int) -> list[str]:
    """One line per check with its measured value; a second with what to fix (or why it was skipped)."""
    lines = [f"{c.status.upper():<4}  {c.name:<{width}}  {c.value}"]
    if c.message:
        lines.append(f"{'':<4}  {'':<{width}}  {'-> ' if c.status != 'skip' else ''}{c.message}")
    return lines


def summary_line(report: Report) -> str:
    tally = ", ".join(f"{n} {s}" for s, n in report.counts().items() if n)
    if report.ok:
        verdict = "PASS"
    else:
        bad = {"fail", "warn"} if report.strict else {"fail"}
        verdict = "FAIL (" + ", ".join(c.name for c in report.checks if c.status in bad) + ")"
    strict = ", strict" if report.strict else ""
    return f"preflight {verdict}: {tally}{strict}, backend {report.backend}, {report.elapsed_s:.1f}s"


def termination_message(report: Report, budget: int = TERMINATION_BUDGET) -> str:
    """The compact JSON for /dev/termination-log, never longer than `budget` bytes.

    Only failures and warnings keep their message (passes and skips carry name, status and value); if that is still
    too long, messages and then values are shortened, the longest first, until it fits. Past that (hundreds of
    checks), entries are dropped from the end and counted in "omitted"."""
    checks = []
    for c in report.checks:
        entry = {"name": c.name, "status": c.status, "value": c.value}
        if c.status in ("fail", "warn") and c.message:
            entry["message"] = c.message
        checks.append(entry)
    doc = {"version": REPORT_VERSION, "ok": report.ok, "backend": report.backend, "checks": checks}

    def encoded() -> bytes:
        return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()

    for key in ("message", "value"):
        while len(encoded()) > budget:
            longest = max(checks, key=lambda e: len(e.get(key, "")))
            text = longest.get(key, "")
            keep = max(16, len(text) - (len(encoded()) - budget) - 3)
            if keep + 3 >= len(text):  # the longest cannot shrink, so none can
                break
            longest[key] = text[:keep] + "..."
    if len(encoded()) > budget:  # absurdly many checks: the verdict, then as many names of what failed as fit
        kept = [{"name": e["name"], "status": e["status"]} for e in checks if e["status"] != "pass"]
        doc["checks"] = kept
        doc["omitted"] = 0
        while kept and len(encoded()) > budget:
            kept.pop()
            doc["omitted"] = len(checks) - len(kept)
    return encoded().decode()

"""The report: verdict and --strict, the human lines, and the termination message's shape and size budget."""

from __future__ import annotations

import json

import pytest

from duplex_sidecars.preflight.result import (
    REPORT_VERSION,
    TERMINATION_BUDGET,
    Report,
    failed,
    passed,
    skipped,
    termination_message,
    warned,
)

CHECKS = [
    passed("memlock", "CAP_IPC_LOCK effective", rlimit_soft=None),
    skipped("hugepages", "not requested", "no --hugepages given"),
    warned("fabric_env", "FI_PROVIDER=efa,tcp", "FI_PROVIDER=efa,tcp lets libfabric fall back to tcp"),
]


def test_warnings_fail_only_when_strict() -> None:
    assert Report("UCX", CHECKS).ok
    assert not Report("UCX", CHECKS, strict=True).ok
    assert not Report("UCX", [*CHECKS, failed("efa_devices", "0 of 16", "found 0 of 16")]).ok


def test_human_lines_have_each_value_and_a_verdict_naming_what_failed() -> None:
    report = Report("LIBFABRIC", [*CHECKS, failed("efa_devices", "0 of 16", "found 0 of 16 EFA devices")], elapsed_s=1)
    lines = report.human_lines()
    assert lines[0].split() == ["PASS", "memlock", "CAP_IPC_LOCK", "effective"]
    assert any(ln.strip() == "-> found 0 of 16 EFA devices" for ln in lines)
    assert any(ln.strip() == "no --hugepages given" for ln in lines)  # a skip's reason, not a fix
    assert lines[-1] == "preflight FAIL (efa_devices): 1 pass, 1 fail, 1 warn, 1 skip, backend LIBFABRIC, 1.0s"


def test_full_report_shape() -> None:
    doc = Report("UCX", CHECKS, elapsed_s=0.5).as_dict()
    assert doc["version"] == REPORT_VERSION and doc["ok"] is True and doc["backend"] == "UCX"
    assert doc["counts"] == {"pass": 1, "fail": 0, "warn": 1, "skip": 1}
    assert doc["checks"][0] == {
        "name": "memlock",
        "status": "pass",
        "value": "CAP_IPC_LOCK effective",
        "data": {"rlimit_soft": None},
    }


def test_termination_message_keeps_messages_of_failures_and_warnings_only() -> None:
    doc = json.loads(termination_message(Report("UCX", CHECKS)))
    assert doc == {
        "version": REPORT_VERSION,
        "ok": True,
        "backend": "UCX",
        "checks": [
            {"name": "memlock", "status": "pass", "value": "CAP_IPC_LOCK effective"},
            {"name": "hugepages", "status": "skip", "value": "not requested"},
            {"name": "fabric_env", "status": "warn", "value": "FI_PROVIDER=efa,tcp",
             "message": "FI_PROVIDER=efa,tcp lets libfabric fall back to tcp"},
        ],
    }  # fmt: skip


@pytest.mark.parametrize("length", [500, 3000, 20000])
def test_long_messages_are_shortened_to_the_budget_longest_first(length: int) -> None:
    checks = [
        failed("efa_devices", "0 of 16", "E" * length),
        failed("nixl_backend", "LIBFABRIC did not start", "N" * (length // 2)),
        failed("hugepages", "x" * length, "short message"),
    ]
    text = termination_message(Report("LIBFABRIC", checks))
    assert len(text.encode()) <= TERMINATION_BUDGET < 4096
    doc = json.loads(text)
    assert doc["ok"] is False and [c["name"] for c in doc["checks"]] == ["efa_devices", "nixl_backend", "hugepages"]
    assert doc["checks"][2]["message"] == "short message"  # the short one is left alone
    assert all(c["message"].startswith(("E", "N", "short")) for c in doc["checks"])


def test_non_ascii_is_measured_in_bytes() -> None:
    text = termination_message(Report("UCX", [failed("x", "v", "é" * 3000)]))
    assert len(text.encode()) <= TERMINATION_BUDGET


def test_too_many_checks_fall_back_to_names_and_statuses() -> None:
    checks = [failed(f"check_{i:03d}", "v" * 40, "m" * 40) for i in range(200)]
    text = termination_message(Report("UCX", checks))
    assert len(text.encode()) <= TERMINATION_BUDGET
    doc = json.loads(text)
    assert doc["ok"] is False and doc["checks"][0] == {"name": "check_000", "status": "fail"}
    assert len(doc["checks"]) + doc["omitted"] == 200

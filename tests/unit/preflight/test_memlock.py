"""memlock: CAP_IPC_LOCK from CapEff in /proc/self/status, RLIMIT_MEMLOCK through an injected getrlimit."""

from __future__ import annotations

import resource

from duplex_sidecars.preflight import memlock

from .trees import CAPS_DEFAULT, CAPS_WITH_IPC_LOCK, FakeRoot

MiB = 1 << 20
NEED = 128 * MiB


def limit(soft: int, hard: int | None = None):
    def getrlimit(which: int) -> tuple[int, int]:
        assert which == resource.RLIMIT_MEMLOCK
        return soft, soft if hard is None else hard

    return getrlimit


def test_ipc_lock_effective_passes_whatever_the_limit(fake_root: FakeRoot) -> None:
    fake_root.status(CAPS_WITH_IPC_LOCK)
    r = memlock.check(fake_root.path, True, NEED, limit(8 * MiB))
    assert r.status == "pass" and r.value == "CAP_IPC_LOCK effective, RLIMIT_MEMLOCK 8 MiB"


def test_unlimited_memlock_passes_without_the_capability(fake_root: FakeRoot) -> None:
    fake_root.status(CAPS_DEFAULT)
    r = memlock.check(fake_root.path, True, NEED, limit(resource.RLIM_INFINITY))
    assert r.status == "pass" and r.data["rlimit_soft"] is None


def test_neither_fails_and_says_to_add_ipc_lock(fake_root: FakeRoot) -> None:
    fake_root.status(CAPS_DEFAULT)
    r = memlock.check(fake_root.path, True, NEED, limit(8 * MiB))
    assert (r.status, r.value) == ("fail", "CAP_IPC_LOCK not effective, RLIMIT_MEMLOCK 8 MiB")
    assert "capabilities.add: [IPC_LOCK]" in r.message and "LimitMEMLOCK" in r.message


def test_non_root_user_with_ipc_lock_only_in_the_bounding_set_is_told_why(fake_root: FakeRoot) -> None:
    fake_root.status("0000000000000000", cap_bnd=CAPS_WITH_IPC_LOCK, uid=1000)
    r = memlock.check(fake_root.path, True, NEED, limit(8 * MiB))
    assert r.status == "fail" and "runs as uid 1000" in r.message and "non-root" in r.message
    assert r.data["ipc_lock_bounding"] and not r.data["ipc_lock_effective"]


def test_a_finite_limit_that_covers_the_check_warns(fake_root: FakeRoot) -> None:
    fake_root.status(CAPS_DEFAULT)
    r = memlock.check(fake_root.path, True, NEED, limit(64 * 1024 * MiB))
    assert r.status == "warn" and "64 GiB" in r.message


def test_not_required_with_ucx_is_a_skip_with_the_measured_value(fake_root: FakeRoot) -> None:
    fake_root.status(CAPS_DEFAULT)
    r = memlock.check(fake_root.path, False, NEED, limit(8 * MiB))
    assert r.status == "skip" and "RLIMIT_MEMLOCK 8 MiB" in r.value


def test_missing_status_file_counts_as_no_capability(fake_root: FakeRoot) -> None:
    assert memlock.check(fake_root.path, True, NEED, limit(8 * MiB)).status == "fail"


def test_has_cap() -> None:
    assert memlock.has_cap(CAPS_WITH_IPC_LOCK, memlock.CAP_IPC_LOCK)
    assert not memlock.has_cap(CAPS_DEFAULT, memlock.CAP_IPC_LOCK)
    assert not memlock.has_cap("", memlock.CAP_IPC_LOCK)

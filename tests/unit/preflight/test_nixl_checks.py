"""Judging what nixl_probe recorded (synthetic records here; tests/integration/test_preflight.py runs the real probe),
and the probe's own helpers."""

from __future__ import annotations

import mmap
from typing import Any

from duplex_sidecars.preflight import nixl_probe
from duplex_sidecars.preflight.nixl_checks import MIN_GBPS, ProbeRun, judge_backend, judge_loopback

MiB = 1 << 20
BACKEND_OK = {"kind": "backend", "backend": "UCX", "ok": True, "nixl": "nixl-cu12 1.5.1", "plugins": ["UCX"]}


def run(*records: dict[str, Any], rc: int | None = 0, stderr: str = "") -> ProbeRun:
    return ProbeRun(list(records), rc, stderr, timeout_s=120)


def loopback(seconds: list[float], **extra: Any) -> dict[str, Any]:
    return {"kind": "loopback", "ok": True, "verified": True, "bytes": 64 * MiB, "seconds": seconds,
            "small_bytes": 4096, "small_seconds": [2e-6, 3e-6, 4e-6]} | extra  # fmt: skip


def test_backend_up() -> None:
    r = judge_backend(run(BACKEND_OK), "UCX")
    assert (r.status, r.value) == ("pass", "UCX instantiated (nixl-cu12 1.5.1)")


def test_nixl_missing_says_how_to_install() -> None:
    rec = {"kind": "backend", "ok": False, "reason": "import", "error": "No module named 'nixl_cu12'"}
    r = judge_backend(run(rec), "UCX")
    assert r.status == "fail" and "pip install --no-deps nixl-cu12" in r.message


def test_missing_plugin_names_the_directories_and_efa() -> None:
    rec = {"kind": "backend", "ok": False, "reason": "no_plugin", "nixl": "nixl-cu12 1.5.1",
           "plugin_dirs": ["/opt/nixl/plugins"], "plugins": ["UCX", "POSIX"]}  # fmt: skip
    r = judge_backend(run(rec), "LIBFABRIC")
    assert r.status == "fail" and "libplugin_LIBFABRIC.so" in r.message and "/opt/nixl/plugins" in r.message
    assert "EFA" in r.message and "it has UCX, POSIX" in r.message


def test_plugin_that_does_not_load_quotes_the_loader() -> None:
    rec = {"kind": "backend", "ok": False, "reason": "create", "error": "nixlNotFoundError: NIXL_ERR_NOT_FOUND",
           "plugin": "/p/libplugin_LIBFABRIC.so", "dlopen_error": "libfabric.so.1: cannot open shared object file"}  # fmt: skip
    r = judge_backend(run(rec), "LIBFABRIC")
    assert r.status == "fail"
    assert "/p/libplugin_LIBFABRIC.so does not load: libfabric.so.1: cannot open shared object file" in r.message
    assert "vpc.amazonaws.com/efa" in r.message and "/opt/amazon/efa/lib" in r.message


def test_backend_that_loads_but_does_not_start_quotes_nixls_log() -> None:
    rec = {"kind": "backend", "ok": False, "reason": "create", "error": "nixlBackendError: NIXL_ERR_BACKEND"}
    err = "I1201 info line\nE1201 10:08:39 nixl_agent.cpp:371] createBackend: backend 'UCX' encountered error\n"
    r = judge_backend(run(rec, stderr=err), "UCX")
    assert r.status == "fail" and "NIXL_ERR_BACKEND" in r.message and "createBackend" in r.message
    assert "EFA" not in r.message  # no EFA advice for UCX


def test_a_hung_probe_fails_at_its_stage() -> None:
    r = judge_backend(run({"stage": "importing nixl"}, {"stage": "creating a NIXL agent"}, rc=None), "LIBFABRIC")
    assert r.status == "fail" and r.value == "timed out after 120s while creating a NIXL agent"
    assert "falling back to tcp/sockets" in r.message
    skipped = judge_loopback(run({"stage": "creating a NIXL agent"}, rc=None), "LIBFABRIC", 1.0)
    assert skipped.status == "skip"


def test_a_crashed_probe_during_the_loopback() -> None:
    r = judge_loopback(run(BACKEND_OK, {"stage": "READ 67108864 bytes, 8 times"}, rc=-11), "UCX", 0.1)
    assert r.status == "fail" and r.value == "the probe exited -11 while READ 67108864 bytes, 8 times"


def test_loopback_bandwidth_latency_and_verification() -> None:
    r = judge_loopback(run(BACKEND_OK, loopback([0.01] * 8)), "UCX", MIN_GBPS["UCX"])
    assert r.status == "pass"
    assert r.data["gbps"] == round(64 * MiB / 0.01 / 1e9, 3) and r.data["verified"] is True
    assert r.data["transfer_ms_p50"] == 10.0 and r.data["small_read_us_p50"] == 3.0
    assert r.value.startswith("6.71 GB/s (8 READs of 64 MiB, p50 10.0 ms), 4 KiB READ p50 3 us, bytes verified")


def test_loopback_below_the_floor_fails() -> None:
    r = judge_loopback(run(BACKEND_OK, loopback([1.0] * 8)), "LIBFABRIC", MIN_GBPS["LIBFABRIC"])
    assert r.status == "fail" and "(0.07 GB/s) is below the LIBFABRIC floor of 1 GB/s" in r.message


def test_the_floor_is_held_against_the_fastest_read() -> None:
    # One clean READ among ones slowed by CPU contention: the path works, the mean says it is slow.
    r = judge_loopback(run(BACKEND_OK, loopback([0.05] + [5.0] * 7)), "UCX", MIN_GBPS["UCX"])
    assert r.status == "pass" and r.data["gbps"] < 0.1 < r.data["best_gbps"]


def test_loopback_with_differing_bytes_fails() -> None:
    rec = {"kind": "loopback", "ok": False, "stage": "verify", "error": "bytes differ at offset 4096"}
    r = judge_loopback(run(BACKEND_OK, rec), "UCX", 0.1)
    assert (r.status, r.value) == ("fail", "bytes differ") and "offset 4096" in r.message


def test_floors_follow_vllms_heuristics() -> None:
    assert MIN_GBPS == {"UCX": 0.1, "LIBFABRIC": 1.0}


def test_mapped_libraries_from_proc_maps() -> None:
    maps = (
        "7f00-7f01 r--p 00000000 08:01 1 /opt/amazon/efa/lib/libfabric.so.1.25.0\n"
        "7f01-7f02 r-xp 00001000 08:01 1 /opt/amazon/efa/lib/libfabric.so.1.25.0\n"
        "7f02-7f03 r-xp 00000000 08:01 2 /site/.nixl_cu12.mesonpy.libs/plugins/libplugin_LIBFABRIC.so\n"
        "7f03-7f04 rw-p 00000000 00:00 0 \n"
    )
    got = nixl_probe.mapped_libraries(maps, ("libplugin_LIBFABRIC", "libfabric.so", "libucp.so"))
    assert got == {
        "libfabric.so": "/opt/amazon/efa/lib/libfabric.so.1.25.0",
        "libplugin_LIBFABRIC": "/site/.nixl_cu12.mesonpy.libs/plugins/libplugin_LIBFABRIC.so",
    }


def test_fill_tags_every_chunk_and_differences_are_located() -> None:
    a, b = mmap.mmap(-1, 3 * nixl_probe.CHUNK + 100), mmap.mmap(-1, 3 * nixl_probe.CHUNK + 100)
    nixl_probe._fill(a)
    b[:] = a[:]
    assert nixl_probe._first_difference(a, b) == -1
    assert a[nixl_probe.CHUNK : nixl_probe.CHUNK + 8] == (1).to_bytes(8, "little")  # chunks differ from each other
    b[2 * nixl_probe.CHUNK + 5] ^= 0xFF
    assert nixl_probe._first_difference(a, b) == 2 * nixl_probe.CHUNK + 5
    nixl_probe._zero(b)
    assert b[:] == bytes(len(b))

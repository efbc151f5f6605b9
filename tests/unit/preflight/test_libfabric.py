"""libfabric_efa: `fi_info -p efa` (fixture scripts, run for real) and, without fi_info, libfabric's files."""

from __future__ import annotations

import pytest

from duplex_sidecars.preflight import libfabric

from .trees import FI_INFO_EFA, FI_INFO_HANGS, FI_INFO_NO_DEVICES, FakeRoot


def check(root: FakeRoot, library_path: str = "", path_env: str = "", provider_path: str = "") -> libfabric.CheckResult:
    return libfabric.check(root.path, True, library_path, path_env, provider_path)


def test_fi_info_listing_efa_domains_passes_with_the_libfabric_version(fake_root: FakeRoot) -> None:
    fake_root.fi_info(FI_INFO_EFA)
    r = check(fake_root)
    assert r.status == "pass"
    assert r.data["domains"] == ["rdmap16s27-rdm", "rdmap32s27-rdm"]
    assert "via /opt/amazon/efa/bin/fi_info: 2 domain(s)" in r.value and "libfabric 2.1.0amzn3.0" in r.value


def test_fi_info_is_also_found_on_path(fake_root: FakeRoot) -> None:
    fake_root.fi_info(FI_INFO_EFA, rel="/usr/local/bin/fi_info")
    r = check(fake_root, path_env="/usr/bin:/usr/local/bin")
    assert r.status == "pass" and "/usr/local/bin/fi_info" in r.value


def test_fi_info_without_efa_fails_with_its_error_and_what_to_do(fake_root: FakeRoot) -> None:
    fake_root.fi_info(FI_INFO_NO_DEVICES)
    r = check(fake_root)
    assert r.status == "fail" and r.data["exit_code"] == 195
    assert "fi_getinfo: -61 (No data available)" in r.message
    assert "EFA devices" in r.message and "/opt/amazon/efa/lib" in r.message


def test_fi_info_listing_only_other_providers_fails(fake_root: FakeRoot) -> None:
    fake_root.fi_info("printf 'provider: tcp\\n    fabric: 172.17.0.0/16\\n'\n")
    assert check(fake_root).status == "fail"


def test_fi_info_that_hangs_fails_at_the_deadline(fake_root: FakeRoot, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(libfabric, "FI_INFO_TIMEOUT_S", 0.3)
    fake_root.fi_info(FI_INFO_HANGS)
    r = check(fake_root)
    assert r.status == "fail" and "did not answer within" in r.message


def test_builtin_efa_provider_is_read_from_the_library(fake_root: FakeRoot) -> None:
    fake_root.libfabric("/opt/amazon/efa/lib")
    fake_root.verbs_driver()
    r = check(fake_root, library_path="/opt/amazon/efa/lib:/usr/lib")
    assert r.status == "pass"
    assert r.data["libfabric"] == "/opt/amazon/efa/lib/libfabric.so.1" and r.data["efa_provider"] == "built in"
    assert r.data["verbs_drivers"] == ["/usr/lib/x86_64-linux-gnu/libibverbs/libefa-rdmav34.so"]
    assert "no fi_info" in r.value


def test_the_installer_prefix_is_searched_without_ld_library_path(fake_root: FakeRoot) -> None:
    fake_root.libfabric("/opt/amazon/efa/lib64")
    fake_root.verbs_driver()
    assert check(fake_root).data["libfabric"] == "/opt/amazon/efa/lib64/libfabric.so.1"


def test_provider_dso_beside_libfabric_counts(fake_root: FakeRoot) -> None:
    fake_root.libfabric("/usr/local/lib", builtin_efa=False)
    fake_root.file("/usr/local/lib/libfabric/libefa-fi.so", b"\x7fELF")
    fake_root.verbs_driver("/usr/local/lib")
    r = check(fake_root)
    assert r.status == "pass" and r.data["efa_provider"] == "/usr/local/lib/libfabric/libefa-fi.so"


def test_provider_dso_on_fi_provider_path_counts(fake_root: FakeRoot) -> None:
    fake_root.libfabric("/usr/lib64", builtin_efa=False)
    fake_root.file("/opt/prov/libefa-fi.so", b"\x7fELF")
    fake_root.verbs_driver("/usr/lib64")
    assert check(fake_root, provider_path="/opt/prov").data["efa_provider"] == "/opt/prov/libefa-fi.so"


def test_libfabric_without_efa_fails(fake_root: FakeRoot) -> None:
    fake_root.libfabric("/usr/lib/x86_64-linux-gnu", builtin_efa=False)
    r = check(fake_root)
    assert r.status == "fail" and "has no efa provider" in r.message and "EFA installer" in r.message


def test_first_libfabric_on_ld_library_path_is_the_one_judged(fake_root: FakeRoot) -> None:
    fake_root.libfabric("/opt/amazon/efa/lib")
    fake_root.libfabric("/opt/other/lib", builtin_efa=False)
    r = check(fake_root, library_path="/opt/other/lib:/opt/amazon/efa/lib")
    assert r.status == "fail" and "/opt/other/lib/libfabric.so.1" in r.message


def test_no_libfabric_at_all_fails_naming_the_installer_and_library_path(fake_root: FakeRoot) -> None:
    r = check(fake_root, library_path="/opt/app/lib")
    assert (r.status, r.value) == ("fail", "no libfabric")
    assert "install the EFA installer" in r.message and "LD_LIBRARY_PATH" in r.message
    assert r.data["searched"][0] == "/opt/app/lib"


def test_efa_provider_without_the_verbs_driver_warns(fake_root: FakeRoot) -> None:
    fake_root.libfabric()
    r = check(fake_root)
    assert r.status == "warn" and "libefa-rdmav" in r.message and "rdma-core" in r.message


def test_marker_split_across_read_chunks_is_found(tmp_path) -> None:
    lib = tmp_path / "lib.so"
    lib.write_bytes(b"x" * 1020 + b"efadv_query_device")
    assert libfabric._contains(lib, b"efadv_", chunk=1024)


def test_skipped_with_ucx(fake_root: FakeRoot) -> None:
    r = libfabric.check(fake_root.path, False, "", "")
    assert r.status == "skip" and "UCX" in r.message


def test_parse_fi_info_and_version() -> None:
    out = "provider: efa\n    fabric: efa\n    domain: rdmap0s31-rdm\nprovider: efa\n    domain: rdmap0s31-dgrm\n"
    info = libfabric.parse_fi_info(out)
    assert info.providers == ["efa"] and info.domains == ["rdmap0s31-rdm", "rdmap0s31-dgrm"]
    assert libfabric.parse_fi_version("fi_info: 1.22.0\nlibfabric: 1.22.0amzn4.0\nlibfabric api: 1.22\n") == (
        "1.22.0amzn4.0"
    )

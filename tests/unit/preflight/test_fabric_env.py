"""fabric_env: FI_PROVIDER, FI_EFA_USE_DEVICE_RDMA, UCX on EFA, UCX_TLS and the libfabric order on LD_LIBRARY_PATH."""

from __future__ import annotations

import pytest

from duplex_sidecars.preflight import fabric_env

from .trees import FakeRoot

GOOD_EFA_ENV = {"FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1", "LD_LIBRARY_PATH": "/opt/amazon/efa/lib"}


def check(env: dict[str, str], backend: str, root: FakeRoot, efa: list[str] | None = None, rdma: int = 0):
    return fabric_env.check(env, backend, root.path, efa or [], rdma)


def test_the_operators_efa_env_passes(fake_root: FakeRoot) -> None:
    fake_root.libfabric("/opt/amazon/efa/lib")
    r = check(GOOD_EFA_ENV, "LIBFABRIC", fake_root)
    assert r.status == "pass" and "FI_PROVIDER=efa" in r.value


@pytest.mark.parametrize("value", ["tcp", "sockets", "tcp;ofi_rxm", "shm"])
def test_libfabric_with_a_provider_other_than_efa_fails(fake_root: FakeRoot, value: str) -> None:
    r = check({"FI_PROVIDER": value}, "LIBFABRIC", fake_root)
    assert r.status == "fail" and "set FI_PROVIDER=efa" in r.message


@pytest.mark.parametrize("value", ["tcp", "sockets", "tcp;ofi_rxm"])
def test_tcp_by_configuration_is_called_a_silent_tcp_fallback(fake_root: FakeRoot, value: str) -> None:
    r = check({"FI_PROVIDER": value}, "LIBFABRIC", fake_root)
    assert "silent TCP fallback by configuration" in r.message


def test_efa_with_a_tcp_fallback_in_the_list_warns(fake_root: FakeRoot) -> None:
    r = check({"FI_PROVIDER": "efa,tcp"}, "LIBFABRIC", fake_root)
    assert r.status == "warn" and "fall back to tcp" in r.message


def test_exclusion_lists(fake_root: FakeRoot) -> None:
    assert check({"FI_PROVIDER": "^efa"}, "LIBFABRIC", fake_root).status == "fail"
    assert check({"FI_PROVIDER": "^shm"}, "LIBFABRIC", fake_root).status == "warn"


def test_unset_fi_provider_is_fine(fake_root: FakeRoot) -> None:
    r = check({}, "LIBFABRIC", fake_root)
    assert (r.status, r.value) == ("pass", "no fabric variables set")


def test_device_rdma_off_warns(fake_root: FakeRoot) -> None:
    r = check({"FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "0"}, "LIBFABRIC", fake_root)
    assert r.status == "warn" and "FI_EFA_USE_DEVICE_RDMA=0" in r.message


def test_installer_libfabric_not_first_on_ld_library_path_warns(fake_root: FakeRoot) -> None:
    fake_root.libfabric("/opt/amazon/efa/lib")
    fake_root.libfabric("/usr/local/lib")
    env = GOOD_EFA_ENV | {"LD_LIBRARY_PATH": "/usr/local/lib:/opt/amazon/efa/lib"}
    r = check(env, "LIBFABRIC", fake_root)
    assert r.status == "warn" and "/usr/local/lib comes first on LD_LIBRARY_PATH" in r.message
    r = check(GOOD_EFA_ENV | {"LD_LIBRARY_PATH": "/usr/lib"}, "LIBFABRIC", fake_root)
    assert r.status == "warn" and "LD_LIBRARY_PATH does not name it" in r.message


def test_without_the_installer_ld_library_path_is_not_judged(fake_root: FakeRoot) -> None:
    assert check({"FI_PROVIDER": "efa", "LD_LIBRARY_PATH": "/x"}, "LIBFABRIC", fake_root).status == "pass"


def test_ucx_on_efa_hardware_warns_about_the_tcp_fallback(fake_root: FakeRoot) -> None:
    r = check({}, "UCX", fake_root, efa=["rdmap16s27"], rdma=1)
    assert r.status == "warn" and "rdmap16s27" in r.message and "LIBFABRIC backend" in r.message


def test_ucx_with_fi_provider_tcp_warns(fake_root: FakeRoot) -> None:
    r = check({"FI_PROVIDER": "tcp"}, "UCX", fake_root)
    assert r.status == "warn" and "FI_PROVIDER=tcp" in r.message
    assert check({"FI_PROVIDER": "efa"}, "UCX", fake_root).status == "pass"


def test_ucx_tls_without_rdma_on_rdma_hardware_warns(fake_root: FakeRoot) -> None:
    assert check({"UCX_TLS": "tcp,self"}, "UCX", fake_root, rdma=2).status == "warn"
    assert check({"UCX_TLS": "^rc,ud,dc"}, "UCX", fake_root, rdma=2).status == "warn"
    assert check({"UCX_TLS": "rc,self"}, "UCX", fake_root, rdma=2).status == "pass"
    # Without RDMA devices TCP is all there is: nothing to warn about.
    assert check({"UCX_TLS": "tcp,self"}, "UCX", fake_root).status == "pass"


def test_every_problem_is_in_the_message(fake_root: FakeRoot) -> None:
    fake_root.libfabric("/opt/amazon/efa/lib")
    env = {"FI_PROVIDER": "tcp", "FI_EFA_USE_DEVICE_RDMA": "0", "LD_LIBRARY_PATH": ""}
    r = check(env, "LIBFABRIC", fake_root)
    assert r.status == "fail"
    assert all(s in r.message for s in ("FI_PROVIDER=tcp", "FI_EFA_USE_DEVICE_RDMA=0", "LD_LIBRARY_PATH"))

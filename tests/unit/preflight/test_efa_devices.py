"""efa_devices: the uverbs count against the request, under fixture /dev/infiniband trees."""

from __future__ import annotations

from duplex_sidecars.preflight import efa_devices

from .trees import FakeRoot


def test_passes_when_every_requested_device_is_there(fake_root: FakeRoot) -> None:
    fake_root.uverbs(16)
    r = efa_devices.check(fake_root.path, requested=16, required=True)
    assert (r.status, r.value) == ("pass", "16 of 16")
    assert r.data["devices"][:2] == ["uverbs0", "uverbs1"] and "rdma_cm" not in r.data["devices"]


def test_missing_devices_name_the_device_plugin_and_the_resource(fake_root: FakeRoot) -> None:
    r = efa_devices.check(fake_root.path, requested=16, required=True)
    assert (r.status, r.value) == ("fail", "0 of 16")
    assert r.message.startswith("found 0 of 16 EFA devices under /dev/infiniband (uverbs*)")
    assert "EFA device plugin" in r.message and "vpc.amazonaws.com/efa: 16" in r.message


def test_fewer_than_requested_fails(fake_root: FakeRoot) -> None:
    fake_root.uverbs(3)
    r = efa_devices.check(fake_root.path, requested=16, required=True)
    assert r.status == "fail" and "found 3 of 16" in r.message


def test_libfabric_without_a_count_needs_at_least_one(fake_root: FakeRoot) -> None:
    r = efa_devices.check(fake_root.path, requested=0, required=True)
    assert r.status == "fail" and "LIBFABRIC needs at least 1" in r.message
    assert "vpc.amazonaws.com/efa: 1" in r.message
    fake_root.uverbs(1)
    assert efa_devices.check(fake_root.path, requested=0, required=True).status == "pass"


def test_more_than_requested_warns_about_hostpath_or_mofed(fake_root: FakeRoot) -> None:
    fake_root.uverbs(32)
    r = efa_devices.check(fake_root.path, requested=16, required=True)
    assert r.status == "warn" and "32" in r.message and "MOFED" in r.message


def test_devices_the_process_cannot_open_fail(fake_root: FakeRoot) -> None:
    fake_root.uverbs(2)
    r = efa_devices.check(fake_root.path, 2, True, openable=lambda p: p.name != "uverbs1")
    assert r.status == "fail" and r.message.startswith("uverbs1 under /dev/infiniband cannot be opened read-write")


def test_not_required_with_ucx_is_a_skip_that_says_why(fake_root: FakeRoot) -> None:
    fake_root.uverbs(2)
    r = efa_devices.check(fake_root.path, requested=0, required=False)
    assert (r.status, r.value) == ("skip", "2 found")
    assert "not required with the UCX backend" in r.message


def test_efa_device_names_tell_efa_from_mellanox(fake_root: FakeRoot) -> None:
    fake_root.rdma_device("rdmap16s27", "efa")
    fake_root.rdma_device("mlx5_0", "mlx5_core")
    (fake_root.path / "sys/class/infiniband/rdmap32s27").mkdir()  # no driver link readable: EFA's naming decides
    assert efa_devices.efa_device_names(fake_root.path) == ["rdmap16s27", "rdmap32s27"]
    assert efa_devices.efa_device_names(fake_root.path / "nowhere") == []

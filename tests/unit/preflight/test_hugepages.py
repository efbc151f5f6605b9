"""hugepages: the node's 2 MiB pool, its free pages and the container's hugetlb limit against the request."""

from __future__ import annotations

from duplex_sidecars.preflight import hugepages
from duplex_sidecars.preflight.quantity import parse_bytes

from .trees import FakeRoot

EFA = parse_bytes("5120Mi")  # 2560 pages


def test_efa_node_with_its_preallocated_pages_passes(fake_root: FakeRoot) -> None:
    fake_root.pool(total=5128, free=5128)
    fake_root.hugetlb_limit(str(EFA))
    r = hugepages.check(fake_root.path, EFA)
    assert r.status == "pass"
    assert r.value.startswith("5120Mi requested (2560 pages); node pool 5128 pages, 5128 free")
    assert r.data["cgroup_limit_bytes"] == EFA


def test_meminfo_is_read_when_sysfs_has_no_2mib_pool(fake_root: FakeRoot) -> None:
    fake_root.meminfo(total=5128, free=4000)
    r = hugepages.check(fake_root.path, EFA)
    assert r.status == "pass" and r.data["source"] == "/proc/meminfo" and r.data["free_pages"] == 4000


def test_meminfo_with_another_default_page_size_is_not_a_2mib_pool(fake_root: FakeRoot) -> None:
    fake_root.meminfo(total=8, free=8, size_kb=1048576)
    r = hugepages.check(fake_root.path, EFA)
    assert (r.status, r.value) == ("fail", "no 2 MiB hugepage pool")


def test_node_without_hugepages_fails_naming_the_sysctl(fake_root: FakeRoot) -> None:
    fake_root.pool(total=0, free=0)
    r = hugepages.check(fake_root.path, EFA)
    assert r.status == "fail"
    assert "the node has 0 hugepages of 2 MiB, 2560 are requested" in r.message and "vm.nr_hugepages" in r.message


def test_container_limit_below_the_request_fails_naming_the_resource(fake_root: FakeRoot) -> None:
    fake_root.pool(total=5128, free=5128)
    fake_root.hugetlb_limit("0")
    r = hugepages.check(fake_root.path, EFA)
    assert r.status == "fail" and "request hugepages-2Mi: 5120Mi" in r.message
    assert "container limit 0 B" in r.value


def test_cgroup_v1_limit_and_its_no_limit_value(fake_root: FakeRoot) -> None:
    fake_root.pool(total=5128, free=5128)
    fake_root.hugetlb_limit(str(2**20), v1=True)
    assert hugepages.check(fake_root.path, EFA).status == "fail"
    fake_root.hugetlb_limit("9223372036852678656", v1=True)  # what v1 writes for "unlimited"
    r = hugepages.check(fake_root.path, EFA)
    assert r.status == "pass" and "container limit unlimited" in r.value


def test_unlimited_v2_limit(fake_root: FakeRoot) -> None:
    fake_root.pool(total=5128, free=5128)
    fake_root.hugetlb_limit("max")
    assert hugepages.check(fake_root.path, EFA).data["cgroup_limit_bytes"] is None


def test_too_few_free_pages_warns(fake_root: FakeRoot) -> None:
    fake_root.pool(total=5128, free=100)
    r = hugepages.check(fake_root.path, EFA)
    assert r.status == "warn" and "only 100 of the node's 5128" in r.message


def test_a_partial_page_counts_as_a_whole_one(fake_root: FakeRoot) -> None:
    fake_root.pool(total=1, free=1)
    assert hugepages.check(fake_root.path, parse_bytes("3Mi")).data["requested_pages"] == 2


def test_not_requested_is_a_skip(fake_root: FakeRoot) -> None:
    r = hugepages.check(fake_root.path, 0)
    assert r.status == "skip" and "--hugepages" in r.message

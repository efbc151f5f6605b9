"""Fixture trees for the preflight's file-based checks: the parts of an EFA pod's filesystem they read, built under
tmp_path (uverbs devices, /proc/meminfo, /proc/self/status, sysfs hugepage pools, cgroup limits, libfabric files)."""

from __future__ import annotations

from pathlib import Path

# CapEff of a root container with Docker's default set (no IPC_LOCK), and the same with IPC_LOCK (bit 14) added.
CAPS_DEFAULT = "00000000a80425fb"
CAPS_WITH_IPC_LOCK = f"{int(CAPS_DEFAULT, 16) | 1 << 14:016x}"


class FakeRoot:
    def __init__(self, path: Path):
        self.path = path

    def file(self, rel: str, text: str | bytes = "", mode: int | None = None) -> Path:
        p = self.path / rel.lstrip("/")
        p.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(text, bytes):
            p.write_bytes(text)
        else:
            p.write_text(text)
        if mode is not None:
            p.chmod(mode)
        return p

    def uverbs(self, n: int) -> None:
        for i in range(n):
            self.file(f"/dev/infiniband/uverbs{i}")
        if n:
            self.file("/dev/infiniband/rdma_cm")  # not a uverbs device: must not be counted

    def rdma_device(self, name: str, driver: str) -> None:
        dev = self.path / "sys/class/infiniband" / name / "device"
        dev.mkdir(parents=True, exist_ok=True)
        (dev / "driver").symlink_to(f"../../../../bus/pci/drivers/{driver}")

    def meminfo(self, total: int, free: int, size_kb: int = 2048) -> None:
        self.file(
            "/proc/meminfo",
            f"MemTotal:       32594204 kB\nMemFree:        12000000 kB\nAnonHugePages:         0 kB\n"
            f"HugePages_Total:   {total}\nHugePages_Free:    {free}\nHugePages_Rsvd:        0\n"
            f"HugePages_Surp:        0\nHugepagesize:       {size_kb} kB\nHugetlb:  {total * size_kb} kB\n",
        )

    def pool(self, total: int, free: int) -> None:
        self.file("/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages", f"{total}\n")
        self.file("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages", f"{free}\n")

    def hugetlb_limit(self, text: str, v1: bool = False) -> None:
        rel = "/sys/fs/cgroup/hugetlb/hugetlb.2MB.limit_in_bytes" if v1 else "/sys/fs/cgroup/hugetlb.2MB.max"
        self.file(rel, text + "\n")

    def status(self, cap_eff: str, cap_bnd: str | None = None, uid: int = 0) -> None:
        self.file(
            "/proc/self/status",
            f"Name:\tpython3\nUmask:\t0022\nState:\tR (running)\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n"
            f"Gid:\t{uid}\t{uid}\t{uid}\t{uid}\nCapInh:\t0000000000000000\nCapPrm:\t{cap_eff}\n"
            f"CapEff:\t{cap_eff}\nCapBnd:\t{cap_bnd or cap_eff}\nCapAmb:\t0000000000000000\n",
        )

    def libfabric(self, lib_dir: str = "/opt/amazon/efa/lib", builtin_efa: bool = True) -> Path:
        # Enough of an ELF's dynamic string table for the check: a built-in efa provider needs rdma-core's efadv_*.
        strings = b"libfabric.so.1\0librdmacm.so.1\0libibverbs.so.1\0"
        if builtin_efa:
            strings += b"libefa.so.1\0efadv_query_device\0efadv_create_qp_ex\0"
        return self.file(f"{lib_dir}/libfabric.so.1", b"\x7fELF\x02\x01\x01" + b"\0" * 57 + strings)

    def verbs_driver(self, lib_dir: str = "/usr/lib/x86_64-linux-gnu") -> None:
        self.file(f"{lib_dir}/libibverbs/libefa-rdmav34.so", b"\x7fELF")

    def fi_info(self, script: str, rel: str = "/opt/amazon/efa/bin/fi_info") -> Path:
        return self.file(rel, "#!/bin/sh\n" + script, mode=0o755)


FI_INFO_EFA = """\
case "$1" in
  --version) echo "fi_info: 2.1.0amzn3.0"; echo "libfabric: 2.1.0amzn3.0"; echo "libfabric api: 2.1" ;;
  *) for d in rdmap16s27 rdmap32s27; do
       printf 'provider: efa\\n    fabric: efa\\n    domain: %s-rdm\\n    version: 201.0\\n' "$d"
       printf '    type: FI_EP_RDM\\n    protocol: FI_PROTO_EFA\\n'
     done ;;
esac
"""
FI_INFO_NO_DEVICES = 'echo "fi_getinfo: -61 (No data available)" >&2\nexit 195\n'
FI_INFO_HANGS = "exec sleep 30\n"

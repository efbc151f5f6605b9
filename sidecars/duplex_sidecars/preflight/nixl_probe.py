"""The NIXL half of the preflight, run as a child process so that a backend that hangs or crashes (LIBFABRIC without
EFA devices hangs forever) becomes a failed check instead of a stuck init container.

It measures and does not judge: it loads the backend, then READs a DRAM buffer between two agents in this process
and verifies the bytes, and appends what it saw as JSON lines to --out (a {"stage"} line before each step, one
{"kind": "backend"} and one {"kind": "loopback"} record). nixl_checks turns those into check results.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import importlib
import json
import mmap
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# The wheels' import names, CUDA 12 first (the `nixl` meta-package would import torch, which the DRAM path never
# needs). This is the simulator's list too; the preflight keeps its own copy so that it imports nothing but the
# standard library until it loads NIXL, and can run from any image that has NIXL (see the package docstring).
NIXL_PACKAGES = ("nixl_cu12", "nixl_cu13", "nixl")
NIXL_DISTRIBUTIONS = {"nixl_cu12": "nixl-cu12", "nixl_cu13": "nixl-cu13", "nixl": "nixl"}
# NIXL's own install prefix in containers built from source (its Dockerfiles), for images without the wheel.
NATIVE_PLUGIN_DIRS = ("/opt/nvidia/nvda_nixl/lib/x86_64-linux-gnu/plugins", "/opt/nvidia/nvda_nixl/lib64/plugins")
SMALL_READ_BYTES = 4096
CHUNK = 1 << 20  # the unit in which buffers are filled and compared
SMALL_READS = 100


class Recorder:
    def __init__(self, path: Path):
        self._f = path.open("a", encoding="utf-8")
        self._start = time.monotonic()

    def write(self, record: dict[str, Any]) -> None:
        self._f.write(json.dumps(record) + "\n")
        self._f.flush()  # the parent reads this file after killing a hung child

    def stage(self, text: str) -> None:
        self.write({"stage": text, "t": round(time.monotonic() - self._start, 3)})


def load_api() -> tuple[Any, str]:
    errors = []
    for package in NIXL_PACKAGES:
        try:
            return importlib.import_module(f"{package}._api"), package
        except ImportError as e:
            errors.append(f"{package}: {e}")
    raise ImportError("; ".join(errors))


def distribution_version(package: str) -> str:
    from importlib import metadata

    try:
        return f"{NIXL_DISTRIBUTIONS[package]} {metadata.version(NIXL_DISTRIBUTIONS[package])}"
    except metadata.PackageNotFoundError:
        return package


def plugin_dirs(api: Any, package: str) -> list[str]:
    """Where NIXL looks for libplugin_*.so: NIXL_PLUGIN_DIR, then the wheel's bundled plugins, then native installs."""
    site = Path(api.__file__).resolve().parent.parent
    dirs = [os.environ.get("NIXL_PLUGIN_DIR", ""), str(site / f".{package}.mesonpy.libs" / "plugins")]
    return [d for d in (*dirs, *NATIVE_PLUGIN_DIRS) if d and Path(d).is_dir()]


def dlopen_error(dirs: list[str], backend: str) -> tuple[str, str]:
    """(plugin path, the dynamic loader's complaint) for the backend's plugin; the complaint is '' if it loads."""
    for d in dirs:
        path = Path(d) / f"libplugin_{backend}.so"
        if path.is_file():
            try:
                ctypes.CDLL(str(path))
            except OSError as e:
                return str(path), str(e)
            return str(path), ""
    return "", ""


def mapped_libraries(maps_text: str, names: tuple[str, ...]) -> dict[str, str]:
    """From /proc/self/maps: the file each named library (by prefix) is mapped from, e.g. libfabric.so -> its path."""
    out: dict[str, str] = {}
    for line in maps_text.splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) < 6:
            continue
        path = parts[5].strip()
        base = os.path.basename(path)
        for name in names:
            if base.startswith(name) and name not in out:
                out[name] = path
    return out


def probe_backend(api: Any, package: str, backend: str, rec: Recorder) -> Any | None:
    """Create the target agent with only `backend`; returns it, or None after recording why it did not come up."""
    dirs = plugin_dirs(api, package)
    base = {"kind": "backend", "backend": backend, "nixl": distribution_version(package), "plugin_dirs": dirs}
    rec.stage(f"creating a NIXL agent with the {backend} backend")
    try:
        agent = api.nixl_agent("preflight-target", api.nixl_agent_config(backends=[backend]))
    except Exception as e:
        plugin, loader = dlopen_error(dirs, backend)
        rec.write(base | {"ok": False, "reason": "create", "error": f"{type(e).__name__}: {e}", "plugin": plugin,
                          "dlopen_error": loader})  # fmt: skip
        return None
    if backend not in agent.backends:
        rec.write(base | {"ok": False, "reason": "no_plugin", "plugins": list(agent.plugin_list)})
        return None
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        maps = ""
    mapped = mapped_libraries(maps, (f"libplugin_{backend}", "libfabric.so", "libucp.so"))
    rec.write(base | {"ok": True, "plugins": list(agent.plugin_list), "mapped": mapped})
    return agent


def _address(buf: mmap.mmap) -> int:
    return ctypes.addressof(ctypes.c_char.from_buffer(buf))


def _fill(buf: mmap.mmap) -> None:
    """Random bytes, with each chunk's index in its first 8 bytes so that a misplaced chunk cannot verify."""
    block = os.urandom(CHUNK)
    for index, off in enumerate(range(0, len(buf), CHUNK)):
        end = min(off + CHUNK, len(buf))
        buf[off:end] = block[: end - off]
        tag = index.to_bytes(8, "little")[: end - off]
        buf[off : off + len(tag)] = tag


def _zero(buf: mmap.mmap) -> None:
    zeros = bytes(CHUNK)
    for off in range(0, len(buf), CHUNK):
        end = min(off + CHUNK, len(buf))
        buf[off:end] = zeros[: end - off]


def _first_difference(a: mmap.mmap, b: mmap.mmap) -> int:
    for off in range(0, len(a), CHUNK):
        x, y = a[off : off + CHUNK], b[off : off + CHUNK]
        if x != y:
            return off + next(i for i in range(len(x)) if x[i] != y[i])
    return -1


def _timed_read(agent: Any, handle: Any) -> tuple[float, str]:
    start = time.perf_counter()
    state = agent.transfer(handle)
    while state == "PROC":
        state = agent.check_xfer_state(handle)
    return time.perf_counter() - start, state


@contextlib.contextmanager
def _released(handle: Any) -> Iterator[Any]:
    try:
        yield handle
    finally:
        with contextlib.suppress(Exception):
            handle.release()


def probe_loopback(api: Any, target: Any, backend: str, size: int, iterations: int, rec: Recorder) -> None:
    """READ `size` bytes from the target agent's buffer into the initiator's, `iterations` times, plus small READs
    for latency. The first and the last READ land on a zeroed buffer and are compared byte for byte."""
    base = {"kind": "loopback", "backend": backend, "bytes": size, "iterations": iterations}
    stage = "allocating"
    try:
        rec.stage(f"allocating two {size}-byte DRAM buffers")
        src, dst = mmap.mmap(-1, size), mmap.mmap(-1, size)
        _fill(src)
        stage = "registering memory"
        rec.stage(f"creating the initiator agent and registering DRAM with {backend}")
        initiator = api.nixl_agent("preflight-initiator", api.nixl_agent_config(backends=[backend]))
        src_reg = target.register_memory([(_address(src), size, 0, "")], "DRAM")
        dst_reg = initiator.register_memory([(_address(dst), size, 0, "")], "DRAM")
        stage = "exchanging agent metadata"
        rec.stage(stage)
        initiator.add_remote_agent(target.get_agent_metadata())
        local = initiator.get_xfer_descs([(_address(dst), size, 0)], "DRAM")
        remote = initiator.get_xfer_descs([(_address(src), size, 0)], "DRAM")
        stage = "READ"
        rec.stage(f"READ {size} bytes, {iterations} times")
        with _released(initiator.initialize_xfer("READ", local, remote, "preflight-target")) as handle:
            first, state = _timed_read(initiator, handle)
            if state != "DONE":
                rec.write(base | {"ok": False, "stage": stage, "error": f"the first READ ended in state {state}"})
                return
            if (off := _first_difference(src, dst)) >= 0:
                rec.write(base | {"ok": False, "stage": "verify", "error": f"bytes differ at offset {off}"})
                return
            via = backend
            with contextlib.suppress(Exception):
                via = initiator.query_xfer_backend(handle)
            seconds = []
            for _ in range(iterations):
                took, state = _timed_read(initiator, handle)
                if state != "DONE":
                    rec.write(base | {"ok": False, "stage": stage, "error": f"a READ ended in state {state}"})
                    return
                seconds.append(took)
            _zero(dst)
            _, state = _timed_read(initiator, handle)
            if state != "DONE" or (off := _first_difference(src, dst)) >= 0:
                rec.write(base | {"ok": False, "stage": "verify", "error": f"the last READ: state {state}, bytes "
                                  f"differ at offset {off}"})  # fmt: skip
                return
        stage = "small READs"
        rec.stage(f"{SMALL_READS} READs of {SMALL_READ_BYTES} bytes")
        small_local = initiator.get_xfer_descs([(_address(dst), SMALL_READ_BYTES, 0)], "DRAM")
        small_remote = initiator.get_xfer_descs([(_address(src), SMALL_READ_BYTES, 0)], "DRAM")
        small = []
        with _released(initiator.initialize_xfer("READ", small_local, small_remote, "preflight-target")) as handle:
            for _ in range(SMALL_READS):
                took, state = _timed_read(initiator, handle)
                if state != "DONE":
                    rec.write(base | {"ok": False, "stage": stage, "error": f"a small READ ended in state {state}"})
                    return
                small.append(took)
        rec.write(
            base
            | {
                "ok": True,
                "verified": True,
                "first_s": first,
                "seconds": seconds,
                "small_bytes": SMALL_READ_BYTES,
                "small_seconds": small,
                "via": via,
            }
        )
        with contextlib.suppress(Exception):
            initiator.remove_remote_agent("preflight-target")
            initiator.deregister_memory(dst_reg)
            target.deregister_memory(src_reg)
    except Exception as e:
        rec.write(base | {"ok": False, "stage": stage, "error": f"{type(e).__name__}: {e}"})


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m duplex_sidecars.preflight.nixl_probe")
    p.add_argument("--backend", required=True)
    p.add_argument("--size", type=int, required=True)
    p.add_argument("--iterations", type=int, required=True)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    rec = Recorder(args.out)
    rec.stage("importing nixl")
    try:
        api, package = load_api()
    except ImportError as e:
        rec.write({"kind": "backend", "backend": args.backend, "ok": False, "reason": "import", "error": str(e)})
        return 0
    agent = probe_backend(api, package, args.backend, rec)
    if agent is not None:
        probe_loopback(api, agent, args.backend, args.size, args.iterations, rec)
    rec.stage("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())

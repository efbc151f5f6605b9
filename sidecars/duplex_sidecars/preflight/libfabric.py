"""Has the image a libfabric with the `efa` provider? Asked of `fi_info -p efa` when the image ships it, else read
from the files: the provider is either built into libfabric.so (which then links rdma-core's libefa, for the efadv_*
calls) or a DSO beside it (`libfabric/libefa-fi.so`). The EFA installer puts both libfabric and fi_info under
/opt/amazon/efa.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from duplex_sidecars.preflight.result import CheckResult, failed, passed, skipped, warned

NAME = "libfabric_efa"
EFA_INSTALLER = "/opt/amazon/efa"
# Where images keep libfabric when LD_LIBRARY_PATH does not say: the EFA installer's prefix first, then the usual
# system library directories (a distribution libfabric, e.g. Debian's libfabric1, has efa built in too).
SYSTEM_LIB_DIRS = (
    f"{EFA_INSTALLER}/lib",
    f"{EFA_INSTALLER}/lib64",
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/usr/local/lib",
)
FI_INFO_DIRS = (f"{EFA_INSTALLER}/bin",)  # the installer does not put its bin/ on PATH
FI_INFO_TIMEOUT_S = 20.0
# A libfabric with the efa provider built in calls rdma-core's efadv_* (EFA direct verbs); nothing else does.
_BUILTIN_EFA_MARKER = b"efadv_"

# argv, timeout -> (exit code, stdout, stderr); raises subprocess.TimeoutExpired or OSError.
Runner = Callable[[Sequence[str], float], tuple[int, str, str]]


def run_command(argv: Sequence[str], timeout: float) -> tuple[int, str, str]:
    proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
    return proc.returncode, proc.stdout, proc.stderr


def _under(root: Path, path: str) -> Path:
    return root / path.lstrip("/")


def find_fi_info(root: Path, path_env: str) -> Path | None:
    for d in (*FI_INFO_DIRS, *path_env.split(os.pathsep)):
        if not d:
            continue
        candidate = _under(root, d) / "fi_info"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


def library_dirs(library_path: str) -> list[str]:
    """LD_LIBRARY_PATH's directories in order, then the system ones, each once."""
    out: list[str] = []
    for d in (*library_path.split(os.pathsep), *SYSTEM_LIB_DIRS):
        if d and d not in out:
            out.append(d)
    return out


def find_libfabric(root: Path, dirs: Sequence[str]) -> tuple[str, Path] | None:
    """The first libfabric the dynamic loader would find: (directory as the image names it, file under root)."""
    for d in dirs:
        for name in ("libfabric.so.1", "libfabric.so"):
            candidate = _under(root, d) / name
            if candidate.is_file():
                return d, candidate
    return None


def _contains(path: Path, marker: bytes, chunk: int = 1 << 20) -> bool:
    with path.open("rb") as f:
        tail = b""
        while block := f.read(chunk):
            if marker in tail + block:
                return True
            tail = block[-len(marker) :]
    return False


def efa_provider(root: Path, lib_dir: str, lib: Path, provider_path: str) -> str | None:
    """How the efa provider comes with this libfabric ('built in' or the DSO's path), or None."""
    for d in (*provider_path.split(os.pathsep), f"{lib_dir.rstrip('/')}/libfabric"):
        if d and (_under(root, d) / "libefa-fi.so").is_file():
            return f"{d.rstrip('/')}/libefa-fi.so"
    try:
        if _contains(lib, _BUILTIN_EFA_MARKER):
            return "built in"
    except OSError:
        pass
    return None


def verbs_efa_drivers(root: Path, dirs: Sequence[str]) -> list[str]:
    """rdma-core's EFA verbs driver (libibverbs/libefa-rdmavNN.so), through which libfabric opens the devices."""
    found = []
    for d in dirs:
        base = _under(root, d) / "libibverbs"
        try:
            found += [f"{d.rstrip('/')}/libibverbs/{p.name}" for p in base.glob("libefa-rdmav*.so")]
        except OSError:
            continue
    return sorted(set(found))


@dataclass(frozen=True)
class FiInfo:
    providers: list[str]
    domains: list[str]


def parse_fi_info(stdout: str) -> FiInfo:
    providers: list[str] = []
    domains: list[str] = []
    for line in stdout.splitlines():
        key, _, val = line.strip().partition(":")
        val = val.strip()
        if key == "provider" and val not in providers:
            providers.append(val)
        elif key == "domain" and val not in domains:
            domains.append(val)
    return FiInfo(providers, domains)


def parse_fi_version(stdout: str) -> str:
    for line in stdout.splitlines():
        key, _, val = line.partition(":")
        if key.strip() == "libfabric":
            return val.strip()
    return ""


def _first_line(text: str) -> str:
    return next((ln.strip() for ln in text.splitlines() if ln.strip()), "")


def _check_with_fi_info(fi_info: Path, shown: str, run: Runner) -> CheckResult:
    argv = [str(fi_info), "-p", "efa"]
    try:
        rc, out, err = run(argv, FI_INFO_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return failed(
            NAME,
            f"{shown} -p efa timed out",
            f"`{shown} -p efa` did not answer within {FI_INFO_TIMEOUT_S:.0f}s: libfabric hangs probing the "
            "devices; check the EFA driver on the node (`cat /sys/module/efa/version`) and the image's libfabric",
        )
    except OSError as e:
        return failed(NAME, f"{shown} not runnable", f"could not run {shown}: {e}")
    info = parse_fi_info(out)
    if rc != 0 or "efa" not in info.providers:
        why = _first_line(err) or _first_line(out) or f"exit code {rc}"
        return failed(
            NAME,
            f"fi_info -p efa: {why}",
            f"libfabric reports no usable efa provider (`{shown} -p efa`: {why}). Without EFA devices in the pod "
            f"(see efa_devices) it never does; with them, use the EFA installer's libfabric ({EFA_INSTALLER}/lib "
            "first on LD_LIBRARY_PATH) and check that FI_PROVIDER does not exclude efa",
            exit_code=rc,
        )
    version = ""
    try:
        vrc, vout, _ = run([str(fi_info), "--version"], FI_INFO_TIMEOUT_S)
        version = parse_fi_version(vout) if vrc == 0 else ""
    except (subprocess.TimeoutExpired, OSError):
        pass
    shown_domains = ", ".join(info.domains[:4]) + (", ..." if len(info.domains) > 4 else "")
    value = f"efa provider via {shown}: {len(info.domains)} domain(s) ({shown_domains})"
    if version:
        value += f", libfabric {version}"
    return passed(NAME, value, source="fi_info", domains=info.domains, libfabric_version=version)


def check(
    root: Path,
    required: bool,
    library_path: str,
    path_env: str,
    provider_path: str = "",
    run: Runner = run_command,
) -> CheckResult:
    if not required:
        return skipped(NAME, "not checked", "libfabric is not used by the UCX backend")
    fi_info = find_fi_info(root, path_env)
    if fi_info is not None:
        return _check_with_fi_info(fi_info, "/" + str(fi_info.relative_to(root)), run)
    dirs = library_dirs(library_path)
    found = find_libfabric(root, dirs)
    if found is None:
        return failed(
            NAME,
            "no libfabric",
            f"no libfabric.so.1 on LD_LIBRARY_PATH or in {', '.join(SYSTEM_LIB_DIRS[:2])} or the system library "
            "directories (and no fi_info): install the EFA installer in the engine image (it puts libfabric in "
            f"{EFA_INSTALLER}/lib) and put that directory first on LD_LIBRARY_PATH (spec.network.efa.libraryPath)",
            searched=dirs,
        )
    lib_dir, lib = found
    lib_shown = f"{lib_dir.rstrip('/')}/{lib.name}"
    provider = efa_provider(root, lib_dir, lib, provider_path)
    if provider is None:
        return failed(
            NAME,
            f"{lib_shown} without efa",
            f"{lib_shown} has no efa provider (it does not link rdma-core's libefa and there is no "
            f"libfabric/libefa-fi.so beside it): a libfabric built without EFA support; use the EFA installer's "
            f"({EFA_INSTALLER}/lib) first on LD_LIBRARY_PATH",
            libfabric=lib_shown,
        )
    drivers = verbs_efa_drivers(root, dirs)
    how = "built in" if provider == "built in" else f"provider {provider}"
    value = f"{lib_shown}, efa {how} (files only: no fi_info in the image)"
    data = {"source": "files", "libfabric": lib_shown, "efa_provider": provider, "verbs_drivers": drivers}
    if not drivers:
        return warned(
            NAME,
            value,
            "no EFA verbs driver (libibverbs/libefa-rdmav*.so) beside the libraries: libfabric's efa provider opens "
            "the devices through rdma-core's libibverbs; install rdma-core from the EFA installer",
            **data,
        )
    return passed(NAME, value, **data)

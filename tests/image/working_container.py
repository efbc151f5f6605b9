"""Working containers of the built duplex image, driven by buildah as root with chroot isolation (what starts
containers on these machines; `podman run` cannot): run a command in it, spawn a long-running one on the host's
network, and remount its root filesystem read-only the way a pod's readOnlyRootFilesystem does."""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path
from typing import Any

from duplex_dev import processes
from duplex_dev.processes import ProcessRecord


def buildah(*args: str, timeout: float = 120.0) -> str:
    proc = subprocess.run(["buildah", *args], capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        raise AssertionError(f"buildah {' '.join(args)} exited {proc.returncode}: {proc.stderr.strip()}")
    return proc.stdout


def image_config(image: str) -> dict[str, Any]:
    """The OCI config of `image` (User, Env, Entrypoint, Cmd, Volumes, Labels, ...)."""
    return json.loads(buildah("inspect", "--type", "image", image))["OCIv1"]["config"]


class WorkingContainer:
    """One buildah working container of `image`. Commands run as the image's configured user unless told otherwise."""

    def __init__(self, image: str):
        self.name = f"duplex-test-{uuid.uuid4().hex[:8]}"
        buildah("from", "--pull=never", "--name", self.name, image)
        self._run_tmpfs: Path | None = None
        self._spawned: list[ProcessRecord] = []

    def argv(self, *command: str, user: str | None = None) -> list[str]:
        as_user = ["--user", user] if user else []
        return ["buildah", "run", "--isolation", "chroot", "--network", "host", *as_user, self.name, "--", *command]

    def run(self, *command: str, user: str | None = None, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.argv(*command, user=user), capture_output=True, text=True, timeout=timeout, check=False
        )

    def spawn(self, *command: str, log: Path) -> ProcessRecord:
        """Start `command` in the container in the background (its own process group), output to `log`."""
        record = processes.spawn(self.argv(*command), log)
        self._spawned.append(record)
        return record

    def make_root_read_only(self) -> None:
        """Remount the container's root filesystem read-only. /tmp stays the image's declared volume (buildah mounts
        one there); /run gets an empty root-owned tmpfs, because buildah writes its own /run/.containerenv, and uid
        65532 cannot write to it either. One run beforehand lets buildah create its other mount points (/etc/hosts,
        /etc/resolv.conf) while it still can."""
        result = self.run("true")
        assert result.returncode == 0, result.stderr
        root = Path(buildah("mount", self.name).strip())
        subprocess.run(["mount", "-o", "remount,ro", str(root)], check=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0755,nosuid,nodev", "tmpfs", str(root / "run")], check=True)
        self._run_tmpfs = root / "run"

    def remove(self) -> None:
        for record in self._spawned:
            processes.stop(record)
        if self._run_tmpfs is not None:
            subprocess.run(["umount", str(self._run_tmpfs)], check=False)
        subprocess.run(["buildah", "rm", self.name], capture_output=True, check=False)

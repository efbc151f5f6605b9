"""Images for the local node without a registry: the image `make image` built (buildah's storage), written once per
image id to an OCI archive in the cache, which the node's containerd imports (LocalCluster.import_image)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

CACHE = Path(os.environ.get("DUPLEX_CACHE") or "~/.cache/duplex").expanduser() / "images"
ROOT = Path(__file__).resolve().parents[2]
REDIS_IMAGE = "localhost/duplex/redis:bookworm"  # the name examples/local-redis.yaml uses


class ImageMissing(RuntimeError):
    pass


def project_image() -> str:
    """The image name and tag `make image` builds (duplex.IMAGE, from pyproject.toml's version)."""
    import duplex

    return str(duplex.IMAGE)


def redis_image() -> str:
    """The Redis image of examples/local-redis.yaml, built (or found current) by hack/build-redis-image.sh."""
    proc = subprocess.run(
        ["bash", str(ROOT / "hack/build-redis-image.sh")], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise ImageMissing(f"hack/build-redis-image.sh failed: {proc.stderr.strip()[-2000:]}")
    return REDIS_IMAGE


def image_id(image: str) -> str:
    proc = subprocess.run(
        ["buildah", "inspect", "--type", "image", "--format", "{{.FromImageID}}", image],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0 or not proc.stdout.strip():
        raise ImageMissing(f"{image} is not in buildah's storage: run `make image` ({proc.stderr.strip()})")
    return proc.stdout.strip()


def archive(image: str | None = None) -> Path:
    """The OCI archive of `image` (default: the project's), written if this image id has none yet; older archives of
    the same name are removed."""
    image = image or project_image()
    ident = image_id(image)
    name = image.rsplit("/", 1)[-1].replace(":", "-")
    path = CACHE / f"{name}-{ident[:12]}.oci.tar"
    if path.is_file():
        return path
    CACHE.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    proc = subprocess.run(
        ["buildah", "push", "--quiet", image, f"oci-archive:{tmp}:{image}"], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise ImageMissing(f"buildah push {image} failed: {proc.stderr.strip()}")
    tmp.replace(path)
    for old in CACHE.glob(f"{name}-*.oci.tar"):
        if old != path:
            old.unlink(missing_ok=True)
    return path

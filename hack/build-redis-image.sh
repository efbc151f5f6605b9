#!/usr/bin/env bash
# Builds the Redis image of the local examples (the router's shared conversation store, run as a pod on the real
# node): Debian's redis-server in a minimal root filesystem made by mmdebstrap, committed with buildah, kept as long as
# its package list is the same. No registry is reachable here, so it cannot be pulled. Prints the image name.
set -euo pipefail
cd "$(dirname "$0")/.."
source hack/versions.sh
t0=$(date +%s)
step() { printf '==> [redis-image +%ss] %s\n' "$(( $(date +%s) - t0 ))" "$*" >&2; }
export BUILDAH_ISOLATION=chroot
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
SECURITY=${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
args=(
  --mode=root --variant=essential --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr --include=redis-server
  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*'
  --dpkgopt='path-exclude=/usr/share/locale/*' "$IMAGE_DEBIAN_SUITE"
)
key=$(printf '%s\n' "${args[@]}" | sha256sum | cut -c1-12)
IMAGE=localhost/duplex/redis:$IMAGE_DEBIAN_SUITE-$key
if buildah inspect --type image "$IMAGE" >/dev/null 2>&1; then
  buildah tag "$IMAGE" "localhost/duplex/redis:$IMAGE_DEBIAN_SUITE"
  step "$IMAGE: present"; echo "$IMAGE"; exit 0
fi
step "$IMAGE: mmdebstrap $IMAGE_DEBIAN_SUITE with redis-server (cold: about a minute)"
work=$(mktemp -d "${TMPDIR:-/tmp}/duplex-redis.XXXXXX")
ctr=
cleanup() { [ -z "$ctr" ] || buildah rm "$ctr" >/dev/null 2>&1 || true; rm -rf "$work"; }
trap cleanup EXIT
mmdebstrap --quiet "${args[@]}" "$work/rootfs.tar" "deb $MIRROR $IMAGE_DEBIAN_SUITE main" \
  "deb $SECURITY $IMAGE_DEBIAN_SUITE-security main" </dev/null
ctr=$(buildah from scratch)
tar -C "$(buildah mount "$ctr")" -xf "$work/rootfs.tar"
buildah umount "$ctr" >/dev/null
# An unprivileged fixed user; its data goes to /data (an emptyDir), nothing is persisted (a cache of replayable
# block metadata: losing it costs one recompute per conversation).
buildah config --user 65532:65532 --workingdir /data --port 6379 \
  --entrypoint '["/usr/bin/redis-server"]' \
  --cmd '["--bind", "0.0.0.0", "--protected-mode", "no", "--save", "", "--appendonly", "no", "--dir", "/data"]' \
  --label "dev.duplex.redis.packages=$key" "$ctr"
buildah commit --quiet --rm "$ctr" "$IMAGE" >/dev/null
buildah tag "$IMAGE" "localhost/duplex/redis:$IMAGE_DEBIAN_SUITE"  # the name the examples use
ctr=
step "$IMAGE: built"
echo "$IMAGE"

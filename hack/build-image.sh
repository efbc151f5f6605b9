#!/usr/bin/env bash
# Builds the duplex image without Docker or a registry (`make image`): a minimal Debian root filesystem made by
# mmdebstrap becomes a local base image (kept, and remade only when its package list changes), then buildah builds
# the Containerfile on it. An image built from the same inputs is kept as it is, and a rebuild reuses the unchanged
# steps (buildah's layer cache). Prints each step with timings on stderr and, last, the image name on stdout.
#
# Environment: PY (the project's Python, default .venv/bin/python), DEBIAN_MIRROR, DEBIAN_SECURITY_MIRROR,
# STORAGE_DRIVER (buildah's; this machine's default, overlay, works), DUPLEX_IMAGE_CA_BUNDLE (CA bundle lent to pip
# in the build, default the host's), DUPLEX_IMAGE_REBUILD_BASE=1 (remake the base, e.g. for Debian security updates).
set -euo pipefail
cd "$(dirname "$0")/.."
source hack/versions.sh
PY=${PY:-.venv/bin/python}
t0=$(date +%s)
step() { printf '==> [image +%ss] %s\n' "$(( $(date +%s) - t0 ))" "$*" >&2; }
# buildah's own progress (STEP n/m, cache hits), each STEP line stamped with the elapsed time, on stderr
stamp() { while IFS= read -r line; do case $line in *"STEP "[0-9]*) printf '    [+%ss] %s\n' "$(( $(date +%s) - t0 ))" "$line";; *) printf '    %s\n' "$line";; esac; done >&2; }
die() { printf 'build-image: %s\n' "$*" >&2; exit 1; }

for tool in buildah mmdebstrap; do
  command -v "$tool" >/dev/null || die "$tool is missing: bash hack/setup.sh installs it (Debian package $tool)"
done
[ "$(id -u)" = 0 ] || die "needs root (mmdebstrap --mode=root and buildah's root storage)"
[ -x "$PY" ] || die "$PY is missing: run make setup"
export BUILDAH_ISOLATION=chroot  # the default (oci) needs a runtime that cannot start containers here

# The tag comes from the package (pyproject.toml's version, through duplex.IMAGE), as does the CRD's default.
read -r IMAGE VERSION < <("$PY" -c 'import duplex; print(duplex.IMAGE, duplex.__version__)')

# --- the base: Debian's python3 and what the Containerfile's stages need, nothing else ---------------------------------
# python3-venv makes the builder's virtualenvs, libstdc++6 is needed by numpy and nixl, ca-certificates by TLS clients.
# The merged-usr hook keeps usrmerge (and the Perl it pulls in) out; docs, man pages and locales are not unpacked.
DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
DEBIAN_SECURITY_MIRROR=${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
base_args=(
  --mode=root --variant=essential --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr
  --include=python3,python3-venv,ca-certificates,libstdc++6
  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright'
  --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*'
  --dpkgopt='path-exclude=/usr/share/locale/*'
  "$IMAGE_DEBIAN_SUITE"
)
base_sources=(
  "deb $DEBIAN_MIRROR $IMAGE_DEBIAN_SUITE main"
  "deb $DEBIAN_MIRROR $IMAGE_DEBIAN_SUITE-updates main"
  "deb $DEBIAN_SECURITY_MIRROR $IMAGE_DEBIAN_SUITE-security main"
)
base_key=$(printf '%s\n' "${base_args[@]}" | sha256sum | cut -c1-12)
BASE=localhost/duplex-base:$IMAGE_DEBIAN_SUITE-$base_key

step "storage driver $(buildah info --format '{{.store.GraphDriverName}}'), isolation $BUILDAH_ISOLATION"
if [ "${DUPLEX_IMAGE_REBUILD_BASE:-}" != 1 ] && buildah inspect --type image "$BASE" >/dev/null 2>&1; then
  step "base $BASE: present, reused"
else
  step "base $BASE: mmdebstrap $IMAGE_DEBIAN_SUITE (python3, python3-venv, ca-certificates, libstdc++6)"
  work=$(mktemp -d "${TMPDIR:-/tmp}/duplex-base.XXXXXX")
  ctr=
  cleanup() { [ -z "$ctr" ] || buildah rm "$ctr" >/dev/null 2>&1 || true; rm -rf "$work"; }
  trap cleanup EXIT
  mmdebstrap --quiet "${base_args[@]}" "$work/rootfs.tar" "${base_sources[@]}" </dev/null
  step "base: importing $(du -h "$work/rootfs.tar" | cut -f1) root filesystem"
  ctr=$(buildah from scratch)
  tar -C "$(buildah mount "$ctr")" -xf "$work/rootfs.tar"
  buildah umount "$ctr" >/dev/null
  buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --cmd /bin/sh \
    --label "dev.duplex.base.packages=$base_key" "$ctr"
  buildah commit --quiet --rm "$ctr" "$BASE" >/dev/null
  ctr=
  cleanup
  trap - EXIT
  # Older bases (another package list) are removed; one still used by a kept image stays.
  for old in $(buildah images --format '{{.Name}}:{{.Tag}}' | grep '^localhost/duplex-base:' | grep -vxF "$BASE"); do
    buildah rmi "$old" >/dev/null 2>&1 || true
  done
  step "base $BASE: built"
fi

# --- the image ---------------------------------------------------------------------------------------------------------
# Its inputs are the base, the Containerfile, .containerignore and what the Containerfile COPYs from the build context
# (less what .containerignore leaves out). Their digest is a label on the image: same inputs, nothing to do.
mapfile -t copied < <(awk '$1 == "COPY" && $2 !~ /^--/ { for (i = 2; i < NF; i++) print $i }' Containerfile)
inputs=$({
  buildah inspect --type image --format '{{.FromImageID}}' "$BASE"
  find Containerfile .containerignore "${copied[@]}" -type f \
    ! -path '*/__pycache__/*' ! -name '*.pyc' ! -path '*.egg-info/*' -print0 | sort -zu | xargs -0 sha256sum
} | sha256sum | cut -c1-16)
built_from=$(buildah inspect --type image --format '{{index .OCIv1.Config.Labels "dev.duplex.inputs"}}' "$IMAGE" \
  2>/dev/null || true)
if [ "$built_from" = "$inputs" ]; then
  step "image $IMAGE: up to date (inputs $inputs)"
  echo "$IMAGE"
  exit 0
fi

previous=$(buildah inspect --type image --format '{{.FromImageID}}' "$IMAGE" 2>/dev/null || true)
secret=()
ca_bundle=${DUPLEX_IMAGE_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
[ ! -s "$ca_bundle" ] || secret=(--secret "id=ca-bundle,src=$ca_bundle")
log=$(mktemp "${TMPDIR:-/tmp}/duplex-image-build.XXXXXX")
trap 'rm -f "$log"' EXIT
step "image $IMAGE: buildah bud (inputs $inputs; unchanged steps come from buildah's layer cache)"
buildah bud --layers --force-rm --isolation chroot -f Containerfile \
  --build-arg "BASE_IMAGE=$BASE" "${secret[@]}" \
  --label "org.opencontainers.image.version=$VERSION" --label "dev.duplex.inputs=$inputs" \
  -t "$IMAGE" . 2>&1 | tee "$log" | stamp
current=$(buildah inspect --type image --format '{{.FromImageID}}' "$IMAGE")

# Images earlier builds left behind (untagged, on a duplex base layer) that this build did not use are removed, so the
# layer cache holds one build's worth; every other image in the store is left alone.
used=$(grep -oE '^--> (Using cache )?[0-9a-f]{11,}' "$log" | awk '{ print substr($NF, 1, 11) }')
base_layers=$(for b in $(buildah images --noheading --format '{{.ID}}' --filter reference=localhost/duplex-base); do
  buildah inspect --type image --format '{{index .OCIv1.RootFS.DiffIDs 0}}{{"\n"}}' "$b"
done)
removed=0
for id in $( [ -z "$previous" ] || echo "$previous"; buildah images --all --noheading --format '{{.ID}} {{.Name}}' \
    | awk '$2 == "<none>" { print $1 }'); do
  grep -qx "${id:0:11}" <<<"$used" && continue
  [ "${id:0:12}" != "${current:0:12}" ] || continue
  first=$(buildah inspect --type image --format '{{index .OCIv1.RootFS.DiffIDs 0}}' "$id" 2>/dev/null) || continue
  if grep -qxF "$first" <<<"$base_layers" && buildah rmi "$id" >/dev/null 2>&1; then removed=$((removed + 1)); fi
done
size=$(buildah images --format '{{.Size}}' "$IMAGE" | head -n1)
step "image $IMAGE: ${current:0:12}, $size (removed $removed stale images of earlier builds)"
echo "$IMAGE"

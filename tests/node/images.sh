#!/usr/bin/env bash
# Builds, with buildah, the images a real node of tests/node/up.sh runs besides gpu-share's own,
# and prints their names (space-separated) for GPU_SHARE_NODE_IMAGES:
#   - registry.k8s.io/pause:3.10.2, the pod sandbox containerd is configured with: Kubernetes'
#     own pause.c (in the k8s.io/kubernetes module tests/node/go.mod pins), linked statically;
#   - gpu-share.test/probe:1, busybox (Debian's busybox-static) with tests/node/probe/probe.sh:
#     a container that prints its environment, its devices and its mounts, then waits.
#   - gpu-share.test/gpu-share:dev, below.
# pause is built only when buildah does not hold it yet.
# Usage: tests/node/images.sh DIR (a scratch directory)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
work="$1/images"
mkdir -p "$work"
have() { buildah inspect --type image "$1" >/dev/null 2>&1; }

pause=registry.k8s.io/pause:3.10.2
if ! have "$pause"; then
  src="$(cd "$here" && go list -m -f '{{.Dir}}' k8s.io/kubernetes)/build/pause/linux/pause.c"
  gcc -Os -Wall -Werror -static -DVERSION=v3.10.2 -o "$work/pause" "$src"
  c=$(buildah from scratch)
  buildah copy "$c" "$work/pause" /pause >/dev/null
  buildah config --entrypoint '["/pause"]' --user 65535:65535 "$c"
  buildah commit --quiet "$c" "$pause" >/dev/null
  buildah rm "$c" >/dev/null
fi

probe=gpu-share.test/probe:1
# Always built afresh (seconds): it follows probe.sh.
root="$work/probe-root"
rm -rf "$root"
mkdir -p "$root/bin"
cp /usr/bin/busybox "$root/bin/busybox"
for cmd in sh env ls cat sleep stat grep sed readlink mount head tr; do
  ln -s busybox "$root/bin/$cmd"
done
cp "$here/probe/probe.sh" "$root/bin/probe"
chmod 755 "$root/bin/probe"
c=$(buildah from scratch)
buildah copy "$c" "$root" / >/dev/null
buildah config --entrypoint '["/bin/probe"]' --user 65532:65532 "$c"
buildah commit --quiet "$c" "$probe" >/dev/null
buildah rm "$c" >/dev/null

# gpu-share.test/gpu-share:dev: the image's own base (the Dockerfile's runtime stage, as .ci/image
# provides it locally) with this build's gpu-share ($GPU_SHARE_BIN, debug info stripped), for the
# reservation pods: built in seconds, from the code under test.
dev=gpu-share.test/gpu-share:dev
base="$(grep -m1 -o 'gcr.io/distroless/cc-debian12:[a-z]*' "$repo/Dockerfile")"
have "$base" || { echo "images.sh: no $base in buildah's storage (.ci/image makes its stand-in)" >&2; exit 1; }
[[ -x ${GPU_SHARE_BIN:-} ]] || { echo "images.sh: GPU_SHARE_BIN (a built gpu-share) is not set" >&2; exit 1; }
objcopy --strip-debug "$GPU_SHARE_BIN" "$work/gpu-share"
c=$(buildah from --pull=never "$base")
buildah copy --chmod 755 "$c" "$work/gpu-share" /usr/local/bin/gpu-share >/dev/null
buildah config --entrypoint '["/usr/local/bin/gpu-share"]' --user 65532:65532 "$c"
buildah commit --quiet "$c" "$dev" >/dev/null
buildah rm "$c" >/dev/null
echo "$pause $probe $dev"

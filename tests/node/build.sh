#!/usr/bin/env bash
# Builds what a real node runs, pinned by tests/node/go.mod: kubelet and kube-proxy (the control
# plane's release, tests/cluster/go.mod), containerd 2 with its runc shim and ctr, runc, crictl, the CNI plugins
# (bridge, host-local, loopback, portmap) and NVIDIA's container runtime, each from its own Go
# module, into
#   ${GPU_SHARE_CACHE:-$HOME/.cache/gpu-share}/node-<first 16 hex of sha256(go.sum)>/
# (the CNI plugins under cni/) and prints that directory. Like tests/cluster/build.sh it builds
# only what is missing, each binary into a temporary name first.
#
# runc is built with cgo and the `seccomp` tag (Debian's libseccomp-dev), as its releases are:
# pods under Pod Security's restricted level ask for the RuntimeDefault seccomp profile, and a
# runc without seccomp refuses any profile.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here"

hash="$(sha256sum go.sum | cut -c1-16)"
out="${GPU_SHARE_CACHE:-$HOME/.cache/gpu-share}/node-$hash"
mkdir -p "$out/cni"

version() { go list -m -f '{{.Version}}' "$1"; }
kube="$(version k8s.io/kubernetes)"
kube_minor="$(cut -d. -f2 <<<"$kube")"
containerd="$(version github.com/containerd/containerd/v2)"
runc="$(version github.com/opencontainers/runc)"
toolkit="$(version github.com/NVIDIA/nvidia-container-toolkit)"

kube_ldflags="-s -w"
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  kube_ldflags+=" -X $p.gitVersion=$kube -X $p.gitMajor=1 -X $p.gitMinor=$kube_minor -X $p.gitTreeState=clean"
done

build() { # name package [go build flags...]
  local name="$1" pkg="$2"
  shift 2
  if [[ -x "$out/$name" ]]; then return; fi
  local start=$SECONDS
  echo "build-node: go build $pkg -> $out/$name" >&2
  go build -trimpath "$@" -o "$out/$name.tmp" "$pkg"
  mv "$out/$name.tmp" "$out/$name"
  echo "build-node: $name built in $((SECONDS - start)) s" >&2
}

# One build at a time: the go command already uses every core for one.
build kubelet k8s.io/kubernetes/cmd/kubelet -ldflags "$kube_ldflags"
build kube-proxy k8s.io/kubernetes/cmd/kube-proxy -ldflags "$kube_ldflags"
build containerd github.com/containerd/containerd/v2/cmd/containerd \
  -tags "no_btrfs no_devmapper no_zfs" \
  -ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=$containerd"
build containerd-shim-runc-v2 github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 \
  -ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=$containerd"
build ctr github.com/containerd/containerd/v2/cmd/ctr \
  -ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=$containerd"
CGO_ENABLED=1 build runc github.com/opencontainers/runc -tags seccomp \
  -ldflags "-s -w -X main.version=${runc#v}"
build crictl sigs.k8s.io/cri-tools/cmd/crictl -ldflags "-s -w"
build nvidia-container-runtime github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-container-runtime \
  -ldflags "-s -w -X github.com/NVIDIA/nvidia-container-toolkit/internal/info.version=${toolkit#v}"
for plugin in main/bridge main/loopback ipam/host-local meta/portmap; do
  build "cni/${plugin#*/}" "github.com/containernetworking/plugins/plugins/$plugin" -ldflags "-s -w"
done
echo "$out"

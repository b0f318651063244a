#!/usr/bin/env bash
# Builds the control plane pinned by tests/cluster/go.mod (kube-apiserver, kube-scheduler,
# kube-controller-manager, kubectl and etcd, from Kubernetes' and etcd's own Go modules) into
#   ${GPU_SHARE_CACHE:-$HOME/.cache/gpu-share}/cluster-<first 16 hex of sha256(go.sum)>/
# and prints that directory. It builds only what is missing there, so a changed go.sum (a new
# release) builds afresh and an unchanged one costs nothing. Each binary is built into a temporary
# name and renamed, so an interrupted build never leaves a half-written binary behind.
#
# Usage: tests/cluster/build.sh            (the Go module proxy is the only source)
# GPU_SHARE_KUBE=1.30 builds another supported minor instead, from its own module
# tests/cluster/v1.30/ (docs/kubernetes-versions.md); unset, empty or the minor of
# tests/cluster/go.mod, it builds that one, as before. up.sh reads the same variable.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here"
kube="${GPU_SHARE_KUBE:-}"
if [[ -n $kube && -f $here/v$kube/go.mod ]]; then
  cd "$here/v$kube"
elif [[ -n $kube && $(grep -m1 -o 'k8s.io/kubernetes v[0-9]*\.[0-9]*' go.mod) != "k8s.io/kubernetes v$kube" ]]; then
  echo "build.sh: GPU_SHARE_KUBE=$kube: no module $here/v$kube/go.mod, and go.mod pins $(
    grep -m1 -o 'k8s.io/kubernetes v[0-9.]*' go.mod)" >&2
  exit 2
fi

hash="$(sha256sum go.sum | cut -c1-16)"
out="${GPU_SHARE_CACHE:-$HOME/.cache/gpu-share}/cluster-$hash"
mkdir -p "$out"

# The release the binaries report (`kubectl version`, the apiserver's /version): the one go.mod pins.
release="$(go list -m -f '{{.Version}}' k8s.io/kubernetes)"
minor="$(cut -d. -f2 <<<"$release")"
ldflags="-s -w"
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X $p.gitVersion=$release -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
done

build() { # name package
  local name="$1" pkg="$2"
  if [[ -x "$out/$name" ]]; then return; fi
  local start=$SECONDS
  echo "build-cluster: go build $pkg -> $out/$name" >&2
  go build -trimpath -ldflags "$ldflags" -o "$out/$name.tmp" "$pkg"
  mv "$out/$name.tmp" "$out/$name"
  echo "build-cluster: $name built in $((SECONDS - start)) s" >&2
}

# One build at a time: the go command already uses every core for one.
build kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver
build kube-scheduler k8s.io/kubernetes/cmd/kube-scheduler
build kube-controller-manager k8s.io/kubernetes/cmd/kube-controller-manager
build kubectl k8s.io/kubernetes/cmd/kubectl
build etcd go.etcd.io/etcd/server/v3
echo "$out"

#!/usr/bin/env bash
# Builds helm (tools/helm), promtool (tools/promtool), kwok (tools/kwok) and kueue (tools/kueue),
# each from its own Go module, into
#   ${GPU_SHARE_CACHE:-$HOME/.cache/gpu-share}/tools-<first 16 hex of sha256 of the go.sum files>/
# and prints that directory. Only what is missing is built; an interrupted build leaves no
# half-written binary (built under a temporary name, then renamed).
#
# Usage: tools/build.sh            (the Go module proxy is the only source)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"

hash="$(cat "$here/helm/go.sum" "$here/promtool/go.sum" "$here/kwok/go.sum" "$here/kueue/go.sum" | sha256sum | cut -c1-16)"
out="${GPU_SHARE_CACHE:-$HOME/.cache/gpu-share}/tools-$hash"
mkdir -p "$out"

build() { # name module-dir package ldflags
  local name="$1" dir="$2" pkg="$3" ldflags="$4"
  if [[ -x "$out/$name" ]]; then return; fi
  local start=$SECONDS
  echo "build-tools: go build $pkg -> $out/$name" >&2
  (cd "$here/$dir" && go build -trimpath -ldflags "$ldflags" -o "$out/$name.tmp" "$pkg")
  mv "$out/$name.tmp" "$out/$name"
  echo "build-tools: $name built in $((SECONDS - start)) s" >&2
}

# The versions the binaries report: the ones go.mod pins.
helm_version="$(cd "$here/helm" && go list -m -f '{{.Version}}' helm.sh/helm/v3)"
prom_version="$(cd "$here/promtool" && go list -m -f '{{.Version}}' github.com/prometheus/prometheus)"
build helm helm helm.sh/helm/v3/cmd/helm "-s -w -X helm.sh/helm/v3/internal/version.version=$helm_version"
build promtool promtool github.com/prometheus/prometheus/cmd/promtool "-s -w -X github.com/prometheus/common/version.Version=$prom_version"
kwok_version="$(cd "$here/kwok" && go list -m -f '{{.Version}}' sigs.k8s.io/kwok)"
build kwok kwok sigs.k8s.io/kwok/cmd/kwok "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=${kwok_version#v}"
kueue_version="$(cd "$here/kueue" && go list -m -f '{{.Version}}' sigs.k8s.io/kueue)"
build kueue kueue sigs.k8s.io/kueue/cmd/kueue "-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=$kueue_version"
echo "$out"

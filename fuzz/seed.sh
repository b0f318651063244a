#!/usr/bin/env bash
# Seeds fuzz/corpus/<target>/ with the fixtures each target's input has the shape of (files
# already there are kept). fuzz/run.sh calls it; so can you after adding a fixture.
set -euo pipefail
cd "$(dirname "$0")"

# Seeds: the fixtures each target's input has the shape of.
seed() { # target files...
  local t="$1"
  shift
  mkdir -p "corpus/$t"
  for f in "$@"; do
    [[ -f $f ]] && cp -n "$f" "corpus/$t/seed-$(basename "$f")"
  done
  return 0
}
fx=../tests/fixtures
seed admission "$fx"/admission/*.json
seed filter "$fx"/extender/filter-*.json
seed prioritize "$fx"/extender/prioritize-*.json "$fx"/extender/filter-names-mps.json
seed bind "$fx"/extender/bind.json
seed preempt "$fx"/extender/preempt-*.json
seed policy ../policies/*.yaml
seed kube_inputs "$fx"/simulate/*.yaml "$fx"/simulate/*.json "$fx"/extender/nodes.yaml ../tests/cluster/nodes.yaml
seed openb "$fx"/simulate/*.csv
mkdir -p corpus/annotation corpus/binds
for v in mps-25 timeslice-50 mig-1g.10gb exclusive-2 "mps-25,memory=8192Mi" "mig-3g.40gb,count=2" \
  $'gpu-share=mps-25\ngpu-share/memory=12Gi' $'gpu-share=mig-1g.10gb\ngpu-share/count=2\ngpu-share/container=main'; do
  printf '%s' "$v" >"corpus/annotation/seed-$(printf '%s' "$v" | sha1sum | cut -c1-12)"
done
[[ -n $(ls corpus/binds) ]] || head -c 256 /dev/urandom >corpus/binds/seed-random


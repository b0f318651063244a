#!/usr/bin/env bash
# Builds the fuzz targets with coverage instrumentation on the stable toolchain and runs them
# with libFuzzer (libfuzzer-sys, the driver cargo-fuzz uses; cargo-fuzz itself wants nightly for
# its sanitizer flags, which these targets do without).
#
#   bash fuzz/run.sh                      # every target, 600 s each, two at a time
#   bash fuzz/run.sh admission 60         # one target for 60 s
#   SECONDS_EACH=1200 JOBS=1 bash fuzz/run.sh
#
# Corpora live in fuzz/corpus/<target>/ (seeded from tests/fixtures, grown by each run and kept
# minimized); crashes go to fuzz/artifacts/<target>/. tests/fuzz_corpus.rs replays every corpus
# file through the same entry points (gpu_share::fuzzing) in the normal test run.
set -euo pipefail
cd "$(dirname "$0")"

TARGETS=(annotation admission filter prioritize bind preempt policy openb kube_inputs binds)
if (($# >= 1)); then TARGETS=("$1"); fi
SECONDS_EACH=${2:-${SECONDS_EACH:-600}}
JOBS=${JOBS:-2}

export RUSTFLAGS="--cfg fuzzing -Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares -Cdebug-assertions -Coverflow-checks"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target}
# With an explicit --target, RUSTFLAGS reach only the targets' code, not build scripts and
# proc macros (which run on the host and must not be instrumented).
triple="$(rustc -vV | sed -n 's/^host: //p')"
cargo build --release --quiet --bins --target "$triple"
bin="$CARGO_TARGET_DIR/$triple/release"

bash seed.sh

run_one() { # target
  local t="$1"
  mkdir -p "artifacts/$t" "corpus/$t"
  local dict=()
  [[ -f dict/$t.dict ]] && dict=(-dict="dict/$t.dict")
  echo "== $t: ${SECONDS_EACH}s" >&2
  "$bin/$t" "corpus/$t" "${dict[@]}" -max_total_time="$SECONDS_EACH" -max_len=65536 -rss_limit_mb=2048 \
    -timeout=10 -artifact_prefix="artifacts/$t/" -print_final_stats=1 >"artifacts/$t.log" 2>&1 || {
    echo "== $t: FAILED (see fuzz/artifacts/$t.log and fuzz/artifacts/$t/)" >&2
    return 1
  }
  # Keep the corpus small: merge into a fresh directory of the inputs that add coverage.
  local min="corpus/.$t.min"
  rm -rf "$min" && mkdir -p "$min"
  "$bin/$t" -merge=1 "$min" "corpus/$t" >/dev/null 2>&1 && rm -rf "corpus/$t" && mv "$min" "corpus/$t"
  local runs
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "artifacts/$t.log" | grep -o '[0-9]*$' || echo "?")
  echo "== $t: clean, $runs executions in ${SECONDS_EACH}s, corpus $(ls "corpus/$t" | wc -l) files" >&2
}

failed=0
running=0
for t in "${TARGETS[@]}"; do
  run_one "$t" &
  running=$((running + 1))
  if ((running >= JOBS)); then
    wait -n || failed=1
    running=$((running - 1))
  fi
done
while ((running > 0)); do
  wait -n || failed=1
  running=$((running - 1))
done
exit $failed

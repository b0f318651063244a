#!/usr/bin/env bash
# gpu-share's checks on a real GPU (benches/results/gpu-runs.md has the results). On a machine with one
# NVIDIA GPU, its driver, python3 with PyTorch and nvidia-ml-py, run in the repo root with a built
# binary beside this script (tests/gpu/gpu-share, or tests/gpu/gpu-share.gz; git ignores both):
#   cp target/release/gpu-share tests/gpu/ && bash tests/gpu/run.sh
# A: facts (driver, CUDA, cgroup dmem, NVML memory-limit API, Container Toolkit, MPS binaries)
# B: `gpu-share reserve` on the real GPU against a fake Kubernetes API (fake_kube.py)
# C: MPS as a budget holder (memory limits, thread percentage, fail-open), torch clients
# Everything is printed and tee'd to $OUT/gpu-log.txt; the summary is $OUT/gpu-results.json.
# No `set -e`: every step has its own timeout and a failing step does not stop the others.
# GPU_RUN_BUDGET (seconds, default 300) bounds the whole run; GPU_RUN_LOCAL=<lib> (machines without
# a GPU only) gives part B the stand-in libnvidia-ml.so.1 of tests/node/standin/nvml instead of the
# driver's (tests/node/standin/nvml/build.sh OUT_DIR builds it as OUT_DIR/libnvidia-ml.so.1).
set -u -o pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
START=$(date +%s)
BUDGET=${GPU_RUN_BUDGET:-300}
if [ -z "${OUT:-}" ]; then OUT=$(mktemp -d /tmp/gpu-out.XXXXXX); fi
mkdir -p "$OUT"
WORK=$(mktemp -d /tmp/gsg.XXXXXX)
: > "$WORK/steps.txt"
PY=$(command -v python3 || command -v python)

exec > >(tee -a "$OUT/gpu-log.txt") 2>&1
TEE_PID=$!

MPS_PIPE="$WORK/mps/mps-pipe"
cleanup() {
  trap - EXIT INT TERM
  # An MPS daemon of ours still up (part C killed hard): stop it.
  if [ -d "$MPS_PIPE" ]; then
    for d in /usr/bin /usr/local/nvidia/bin /usr/local/cuda/bin; do
      if [ -x "$d/nvidia-cuda-mps-control" ]; then
        echo quit | CUDA_MPS_PIPE_DIRECTORY="$MPS_PIPE" timeout 10 "$d/nvidia-cuda-mps-control" >/dev/null 2>&1
        break
      fi
    done
  fi
  # Children of this script still running (a step's timeout was itself interrupted).
  for p in $(jobs -p); do kill "$p" 2>/dev/null; done
}
trap cleanup EXIT
trap 'echo "=== run.sh interrupted"; exit 130' INT TERM

left() { echo $(( BUDGET - ($(date +%s) - START) )); }

# step NAME LIMIT_SECONDS CMD...: runs CMD under `timeout`, records rc and seconds.
step() {
  local name=$1 limit=$2; shift 2
  local t0; t0=$(date +%s)
  if [ "$limit" -lt 5 ]; then
    echo "=== step $name SKIPPED: only ${limit}s left"
    echo "$name x 0" >> "$WORK/steps.txt"
    return
  fi
  echo
  echo "=== step $name (limit ${limit}s, $(date -u +%H:%M:%S) UTC, $(( $(date +%s) - START ))s into the run)"
  timeout -s TERM -k 10 "$limit" "$@"
  local rc=$?
  local dt=$(( $(date +%s) - t0 ))
  [ "$rc" = 124 ] || [ "$rc" = 137 ] && echo "!!! step $name TIMED OUT after ${limit}s"
  echo "=== end $name: rc=$rc, ${dt}s"
  echo "$name $rc $dt" >> "$WORK/steps.txt"
}

echo "=== gpu-share GPU checks: $(date -u) host=$(hostname) repo=$(pwd) OUT=$OUT WORK=$WORK budget=${BUDGET}s"
echo "python: $PY $($PY --version 2>&1)"
if [ -z "$PY" ]; then echo "!!! no python3: parts A-C need it"; fi
[ -f "$HERE/gpu-share" ] || gunzip -k "$HERE/gpu-share.gz"; chmod +x "$HERE/gpu-share" 2>/dev/null

# A: facts (typically < 10 s).
A_LIMIT=$(( $(left) < 60 ? $(left) : 60 ))
step A_facts "$A_LIMIT" "$PY" -u "$HERE/facts.py" --json-out "$WORK/a.json" --smi-q-out "$OUT/nvidia-smi-q.txt"

# B: the reservation agent on the real GPU (typically < 10 s).
B_ARGS=()
if [ -n "${GPU_RUN_LOCAL:-}" ]; then B_ARGS+=(--local "$GPU_RUN_LOCAL"); fi
B_LIMIT=$(( $(left) - 150 )); [ "$B_LIMIT" -gt 75 ] && B_LIMIT=75
step B_reserve "$B_LIMIT" "$PY" -u "$HERE/reserve_test.py" --binary "$HERE/gpu-share" --work "$WORK/b" \
  --requests-log "$OUT/fake-kube-requests.jsonl" --json-out "$WORK/b.json" --wait 20 ${B_ARGS[@]+"${B_ARGS[@]}"}

# C: MPS (the rest of the budget, 25 s kept for the summary; it stops itself before its limit).
C_LIMIT=$(( $(left) - 25 ))
C_BUDGET=$(( C_LIMIT - 15 ))
step C_mps "$C_LIMIT" "$PY" -u "$HERE/mps.py" --work "$WORK/mps" --json-out "$WORK/c.json" \
  --logs-out "$OUT/mps-logs.txt" --budget "$C_BUDGET" --client-timeout 60 --matmul-s 3

# Summary.
echo
echo "=== step summary"
timeout 20 "$PY" "$HERE/summarize.py" "$WORK" "$OUT/gpu-results.json" "$START"
echo "=== done in $(( $(date +%s) - START ))s; files in $OUT:"
ls -la "$OUT"

# Let tee finish writing the log before the runner collects $OUT.
exec >/dev/null 2>&1
wait "$TEE_PID" 2>/dev/null
exit 0

#!/usr/bin/env bash
# Does a client see whether MPS serves it (CU_DEVICE_ATTRIBUTE_MPS_ENABLED)? No MPS env, the daemon up
# (with and without a limit), the daemon gone, a pipe directory that never existed.
#   bash tests/gpu/mps-attr.sh      (benches/results/gpu-runs.md has the results)
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee -a "$OUT/mps-attr.txt") 2>&1
H=$(cd "$(dirname "$0")" && pwd)
CTL=$(command -v nvidia-cuda-mps-control || echo /usr/local/nvidia/bin/nvidia-cuda-mps-control)
W=$(mktemp -d); P=$W/pipe; L=$W/log; mkdir -p $P $L
python3 -c "import cuda.bindings, sys; print('cuda-bindings', cuda.bindings.__version__)" 2>&1
echo "== no MPS env"; timeout 60 python3 $H/mps_attr.py
export CUDA_MPS_PIPE_DIRECTORY=$P CUDA_MPS_LOG_DIRECTORY=$L
timeout 20 $CTL -d; sleep 1
echo "== daemon up"; timeout 60 python3 $H/mps_attr.py
echo "== daemon up, limit 0=2G"; CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=2G timeout 60 python3 $H/mps_attr.py
echo quit | timeout 20 $CTL; sleep 2
echo "== daemon gone (pipe dir left)"; timeout 60 python3 $H/mps_attr.py
echo "== pipe dir never existed"; CUDA_MPS_PIPE_DIRECTORY=/tmp/none-$$ timeout 60 python3 $H/mps_attr.py
echo "== done"

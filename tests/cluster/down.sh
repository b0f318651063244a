#!/usr/bin/env bash
# Stops every process tests/cluster/up.sh DIR started, by the PIDs in DIR/pids: first SIGTERM,
# then, for any still running after 10 s, SIGKILL. The directory (logs, certificates, etcd's data)
# is left for inspection; remove it yourself.
# Usage: tests/cluster/down.sh DIR
set -uo pipefail
if [[ $# -ne 1 ]]; then
  echo "usage: $0 DIR" >&2
  exit 2
fi
dir="$1"
shopt -s nullglob
# Real nodes first (tests/node/down.sh): their pods, containerd and kubelet, links and cgroups.
if [[ -e $dir/real-nodes ]]; then
  "$(dirname "$0")/../node/down.sh" "$dir"
  rm -f "$dir/real-nodes"
fi
pids=()
stop() { # pid-file: SIGTERM to the process it names, if it still runs
  local pid
  pid="$(cat "$1")"
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null
    pids+=("$pid")
  fi
  rm -f "$1"
}
# The clients of the API first, etcd last; then anything else up.sh or a test started.
for name in kwok kube-scheduler kube-controller-manager extender webhook kube-apiserver etcd; do
  for f in "$dir/pids/$name.pid" "$dir"/pids/"$name"-*.pid; do
    [[ -f $f ]] && stop "$f"
  done
done
for f in "$dir"/pids/*.pid; do
  stop "$f"
done
deadline=$((SECONDS + 10))
for pid in "${pids[@]}"; do
  while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.2; done
  if kill -0 "$pid" 2>/dev/null; then
    kill -KILL "$pid" 2>/dev/null
  fi
done
echo "down.sh: stopped ${#pids[@]} process(es) of $dir" >&2

#!/usr/bin/env bash
# Stops the real nodes tests/node/up.sh started in DIR and removes what they leave on the machine:
# kubelet first (so it starts nothing again), then every pod through containerd's CRI, then
# containerd; any process still in a node's cgroups is killed and the cgroups removed; the node's
# mount namespace is released, its pod bridge removed; kube-proxy's rules are cleaned up.
# Idempotent. tests/cluster/down.sh calls it before stopping the control plane.
# Usage: tests/node/down.sh DIR
set -uo pipefail
dir="$1"
here="$(cd "$(dirname "$0")" && pwd)"
shopt -s nullglob
stop() { # pid-file
  [[ -f $1 ]] || return 0
  local pid
  pid="$(cat "$1")"
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -KILL "$pid" 2>/dev/null
  fi
  rm -f "$1"
}
bin=""
[[ -d $dir/nodes ]] && bin="$("$here/build.sh" 2>/dev/null)"
for n in "$dir"/nodes/*/; do
  n="${n%/}"
  name="$(basename "$n")"
  stop "$dir/pids/node-$name-kubelet.pid"
  stop "$dir/pids/node-$name-gpu-plugin.pid"
  if [[ -e $n/mnt.ns && -n $bin ]] && [[ -f $dir/pids/node-$name-containerd.pid ]]; then
    timeout 60 nsenter --mount="$n/mnt.ns" -- "$bin/crictl" --runtime-endpoint unix:///run/containerd/containerd.sock \
      rmp --force --all >/dev/null 2>&1
  fi
  stop "$dir/pids/node-$name-containerd.pid"
  # What outlived containerd (shims, containers): everything in the node's cgroups.
  for root in /sys/fs/cgroup/*/gpu-share-"$name"; do
    find "$root" -name cgroup.procs -exec cat {} + 2>/dev/null | xargs -r kill -KILL 2>/dev/null
  done
  sleep 0.5
  for root in /sys/fs/cgroup/*/gpu-share-"$name"; do
    find "$root" -depth -type d -exec rmdir {} + 2>/dev/null
  done
  if [[ -e $n/mnt.ns ]]; then
    umount "$n/mnt.ns" 2>/dev/null
    umount -l "$n" 2>/dev/null
  fi
  index="$(cat "$n/index" 2>/dev/null)"
  [[ -n $index ]] && ip link del "gs-br$index" 2>/dev/null
done
stop "$dir/pids/kube-proxy.pid"
if [[ -n $bin && -x $bin/kube-proxy ]]; then
  "$bin/kube-proxy" --cleanup >/dev/null 2>&1
fi
# kubelet's canary chains (kube-proxy --cleanup leaves kubelet's own).
for table in nat mangle filter; do
  iptables -t "$table" -F KUBE-KUBELET-CANARY 2>/dev/null && iptables -t "$table" -X KUBE-KUBELET-CANARY 2>/dev/null
done
ip link del gs-api0 2>/dev/null
exit 0

#!/usr/bin/env bash
# Starts a real node in the cluster tests/cluster/up.sh DIR runs: kubelet (the control plane's
# release) with containerd 2 and runc, pods on a bridge network of their own (the CNI plugins), and
# NVIDIA's container runtime in CDI mode as the `nvidia` runtime handler. Everything is built from
# Go modules by tests/node/build.sh; images are built here with buildah and imported into the
# node's containerd: nothing is pulled.
#
# Each node lives in a mount namespace of its own, where directories under DIR/nodes/NAME/mnt are
# bound over the paths a node owns (/var/lib/kubelet, /var/lib/containerd, /run/containerd,
# /run/cdi, /etc/cdi, /var/lib/cni, /var/log/pods, /run/gpu-share, ...): kubelet's device-plugin
# socket directory is fixed at /var/lib/kubelet/device-plugins, and a hostPath volume names a
# path on the node, so two nodes on one machine need two views of these paths, as two machines
# have. The namespace's holder, containerd and kubelet are started by DIR/start/node-NAME-*.sh,
# with their PIDs in DIR/pids and logs in DIR/logs; tests/node/down.sh DIR stops them and removes
# their containers, links and cgroups.
#
# The host: cgroup v1 (kubelet's `failCgroupV1: false`, KEP-5573: from 1.35 kubelet refuses
# cgroup v1 unless told), cgroupfs driver, each node under a cgroup root of its own
# (/gpu-share-NAME). Swap is tolerated (`failSwapOn: false`).
#
# Usage: tests/node/up.sh DIR NAME INDEX      (INDEX 1..200: the node's pod subnet 10.88.INDEX.0/24
#        and kubelet's ports). tests/cluster/up.sh calls it for GPU_SHARE_CLUSTER_REAL_NODES.
# Environment: GPU_SHARE_NODE_IMAGES (images to import, as buildah names them, space-separated),
# GPU_SHARE_NODE_HOST_IP (the address pods reach the API server at; tests/cluster/up.sh sets it).
set -euo pipefail

if [[ $# -ne 3 ]]; then
  echo "usage: $0 DIR NAME INDEX" >&2
  exit 2
fi
here="$(cd "$(dirname "$0")" && pwd)"
dir="$(cd "$1" && pwd)"
name="$2"
index="$3"
[[ $index =~ ^[0-9]+$ ]] && ((index >= 1 && index <= 200)) || {
  echo "up.sh: INDEX=$index: 1 to 200" >&2
  exit 2
}
[[ $(id -u) == 0 ]] || {
  echo "tests/node/up.sh: a real node needs root (mount namespaces, cgroups, network links)" >&2
  exit 1
}
# shellcheck disable=SC1091
source <(grep -E '^(KUBECTL|API_SERVER)=' "$dir/env" | sed 's/^/export /')
host_ip="${GPU_SHARE_NODE_HOST_IP:?tests/cluster/up.sh sets GPU_SHARE_NODE_HOST_IP}"
n="$dir/nodes/$name"
started=$SECONDS
say() { echo "node $name [$((SECONDS - started))s] $*" >&2; }
fail() {
  echo "tests/node/up.sh ($name): $*" >&2
  for f in "$dir/logs/node-$name"-*.log; do
    [[ -s $f ]] || continue
    echo "---- last lines of $f" >&2
    tail -n 20 "$f" >&2
  done
  exit 1
}
wait_for() { # what seconds command...
  local what="$1" limit="$2"
  shift 2
  local deadline=$((SECONDS + limit))
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || fail "$what not ready after ${limit}s"
    sleep 0.3
  done
}
launcher() { # name command... (as tests/cluster/up.sh's, run inside the node's mount namespace)
  local what="$1"
  shift
  {
    echo "#!/usr/bin/env bash"
    echo "# Starts $what of node $name detached (written by tests/node/up.sh)."
    printf 'setsid nsenter --mount=%q --' "$n/mnt.ns"
    printf ' %q' "$@"
    printf ' >>%q 2>&1 </dev/null &\n' "$dir/logs/node-$name-$what.log"
    printf 'echo $! >%q\n' "$dir/pids/node-$name-$what.pid"
  } >"$dir/start/node-$name-$what.sh"
  chmod +x "$dir/start/node-$name-$what.sh"
  "$dir/start/node-$name-$what.sh"
}
in_node() { nsenter --mount="$n/mnt.ns" -- "$@"; }

bin="$("$here/build.sh")"
if mountpoint -q "$n/mnt.ns" 2>/dev/null; then
  fail "$n is still a running node's (tests/node/down.sh $dir first)"
fi
umount -l "$n" 2>/dev/null || true
rm -rf "$n"
mkdir -p "$n"/{mnt,etc,images}
echo "$index" >"$n/index"

# ---- the node's own view of a node's paths ----------------------------------------------------------
# The paths a node owns, each bound over from DIR/nodes/NAME/mnt/<path>. The mount points are made
# on the machine (empty directories) once; what is written there stays in the node's directory.
node_paths=(/var/lib/kubelet /var/lib/containerd /run/containerd /run/cdi /etc/cdi /var/lib/cni
  /var/log/pods /var/log/containers /run/gpu-share /run/nvidia /etc/nvidia-container-runtime
  /etc/cni/net.d /opt/cni/bin)
for p in "${node_paths[@]}"; do
  mkdir -p "$p" "$n/mnt$p"
done
# A persistent mount namespace: a private copy of the machine's mounts, held by a bind mount of
# /proc/PID/ns/mnt on a file (DIR/nodes/NAME/mnt.ns), so no process has to keep it alive.
if ! mountpoint -q "$n/mnt.ns" 2>/dev/null; then
  mount --bind "$n" "$n" 2>/dev/null || true
  mount --make-private "$n"
  touch "$n/mnt.ns"
  unshare --mount="$n/mnt.ns" --propagation private true || fail "unshare --mount: cannot make the node's mount namespace"
fi
for p in "${node_paths[@]}"; do
  in_node mount --bind "$n/mnt$p" "$p"
done
cp "$bin"/cni/* "$n/mnt/opt/cni/bin/"

# ---- the node's identity: a client certificate for system:node:NAME (the Node authorizer's) ---------
pki="$dir/pki"
openssl req -newkey rsa:2048 -nodes -subj "/O=system:nodes/CN=system:node:$name" \
  -keyout "$n/kubelet-client.key" -out "$n/kubelet-client.csr" 2>/dev/null
printf 'basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n' >"$n/client.ext"
openssl x509 -req -in "$n/kubelet-client.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
  -days 2 -extfile "$n/client.ext" -out "$n/kubelet-client.crt" 2>/dev/null
# kubelet's serving certificate, from the cluster's CA, for the address the API server calls.
openssl req -newkey rsa:2048 -nodes -subj "/O=system:nodes/CN=system:node:$name" \
  -keyout "$n/kubelet-serving.key" -out "$n/kubelet-serving.csr" 2>/dev/null
printf 'basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\nsubjectAltName=IP:%s,DNS:%s\n' \
  "$host_ip" "$name" >"$n/serving.ext"
openssl x509 -req -in "$n/kubelet-serving.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
  -days 2 -extfile "$n/serving.ext" -out "$n/kubelet-serving.crt" 2>/dev/null
cat >"$n/kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
  - name: gpu-share-test
    cluster: {server: "$API_SERVER", certificate-authority: "$pki/ca.crt"}
contexts:
  - name: node
    context: {cluster: gpu-share-test, user: node}
current-context: node
users:
  - name: node
    user: {client-certificate: "$n/kubelet-client.crt", client-key: "$n/kubelet-client.key"}
EOF

# ---- containerd ---------------------------------------------------------------------------------------
# runc is the default handler; `nvidia` is NVIDIA's runtime (as the GPU Operator's toolkit
# configures containerd), in CDI mode over the same runc. containerd's own CDI support reads the
# node's /etc/cdi and /run/cdi for the devices kubelet passes (the device plugin's CDI answers).
cat >"$n/containerd.toml" <<EOF
version = 4
root = "/var/lib/containerd"
state = "/run/containerd"
[grpc]
  address = "/run/containerd/containerd.sock"
[ttrpc]
  address = "/run/containerd/containerd.sock.ttrpc"
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "registry.k8s.io/pause:3.10.2"
[plugins.'io.containerd.cri.v1.runtime']
  # This machine withholds CAP_SYS_RESOURCE (not in its bounding set), without which no process
  # may lower an oom_score_adj: runc's init fails to set the sandbox's -998 ("failed to update
  # /proc/self/oom_score_adj: Permission denied"). containerd's setting for hosts without the
  # capability (rootless ones) keeps every container's score at or above containerd's own.
  restrict_oom_score_adj = true
  cdi_spec_dirs = ["/etc/cdi", "/var/run/cdi"]
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = "$bin/runc"
        SystemdCgroup = false
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.nvidia]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.nvidia.options]
        BinaryName = "$bin/nvidia-container-runtime"
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["/opt/cni/bin"]
    conf_dir = "/etc/cni/net.d"
[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
EOF
# NVIDIA's runtime, as the toolkit's `nvidia-ctk runtime configure --cdi.enabled` leaves it: CDI
# mode, devices named in NVIDIA_VISIBLE_DEVICES (indexes, UUIDs or fully qualified CDI names)
# resolved from the node's CDI specs, runc underneath.
cat >"$n/mnt/etc/nvidia-container-runtime/config.toml" <<EOF
[nvidia-container-runtime]
mode = "cdi"
runtimes = ["$bin/runc"]
log-level = "info"
debug = "$dir/logs/node-$name-nvidia-container-runtime.log"

[nvidia-container-runtime.modes.cdi]
default-kind = "nvidia.com/gpu"
spec-dirs = ["/etc/cdi", "/var/run/cdi"]
annotation-prefixes = ["cdi.k8s.io/"]
EOF
cat >"$n/mnt/etc/cni/net.d/10-gpu-share.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "gpu-share-$name",
  "plugins": [
    {
      "type": "bridge", "bridge": "gs-br$index", "isGateway": true, "ipMasq": false, "hairpinMode": true,
      "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.88.$index.0/24"}]], "routes": [{"dst": "0.0.0.0/0"}]}
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
say "containerd $("$bin/containerd" --version | awk '{print $3}'), runc $("$bin/runc" --version | awk 'NR==1{print $3}')"
launcher containerd env PATH="$bin:$PATH" "$bin/containerd" --config "$n/containerd.toml" --log-level warn
wait_for containerd 60 in_node "$bin/ctr" --address /run/containerd/containerd.sock version

# ---- images: built here, imported, never pulled -------------------------------------------------------
for image in ${GPU_SHARE_NODE_IMAGES:-}; do
  archive="$n/images/$(tr '/:' '__' <<<"$image").tar"
  [[ -s $archive ]] || buildah push --quiet "$image" "docker-archive:$archive:$image" >/dev/null ||
    fail "buildah push $image: no such image in buildah's storage"
  in_node "$bin/ctr" --address /run/containerd/containerd.sock -n k8s.io images import --local "$archive" \
    >>"$dir/logs/node-$name-images.log" 2>&1 || fail "ctr images import $image"
done

# ---- the stand-in GPU stack (tests/node/standin): NVIDIA's part, played without a GPU ----------------
# The node's configuration, tests/node/nodes/NAME.json: GPU Feature Discovery's labels, the
# taints, and the device plugin's configuration (NVIDIA's own, plus the stand-in GPUs). Stand-in
# device nodes (char 1:3, as /dev/null) under DIR/nodes/NAME/standin/dev; the CDI spec
# `nvidia-ctk cdi generate` would write, in the node's /var/run/cdi; the stand-in
# libnvidia-ml.so.1 and nvidia-cuda-mps-control that spec mounts into containers; the device
# plugin on kubelet's socket.
config="$here/nodes/$name.json"
[[ -f $config ]] || fail "no node configuration $config"
standin="$dir/standin"
if [[ ! -x $standin/gpu-plugin ]]; then
  mkdir -p "$standin/bin"
  (cd "$here/standin" && go build -trimpath -o "$standin/gpu-plugin.tmp" ./cmd/gpu-plugin) || fail "go build gpu-plugin"
  # The driver's MPS control, which NVIDIA's spec mounts into containers: static, as the
  # reservation's image has no shell and no libraries of the driver's.
  (cd "$here/standin" && CGO_ENABLED=0 go build -trimpath -o "$standin/bin/nvidia-cuda-mps-control" \
    ./cmd/nvidia-cuda-mps-control) || fail "go build nvidia-cuda-mps-control"
  mv "$standin/gpu-plugin.tmp" "$standin/gpu-plugin"
fi
driver="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["plugin"]["standin"]["driverVersion"])' "$config")"
[[ -e $standin/lib-$driver/libnvidia-ml.so.1 ]] || "$here/standin/nvml/build.sh" "$standin/lib-$driver" "$driver" >/dev/null ||
  fail "the stand-in libnvidia-ml.so.$driver did not build"
mkdir -p "$n/standin/dev" "$n/standin/nvml"
python3 - "$config" "$n" "$standin/lib-$driver" "$standin/bin" <<'PY'
import json, sys
config, n, lib, bins = sys.argv[1:]
plugin = json.load(open(config))["plugin"]
plugin["standin"].update(deviceDir=f"{n}/standin/dev", libDir=lib, nvmlLogDir=f"{n}/standin/nvml",
                         binDir=bins)
json.dump(plugin, open(f"{n}/gpu-plugin.json", "w"), indent=1)
PY
in_node "$standin/gpu-plugin" devices --config "$n/gpu-plugin.json" || fail "gpu-plugin devices"
in_node "$standin/gpu-plugin" cdi-spec --config "$n/gpu-plugin.json" --form nvidia-ctk --cdi-dir /var/run/cdi ||
  fail "gpu-plugin cdi-spec"
mapfile -t node_labels < <(python3 -c '
import json, sys
c = json.load(open(sys.argv[1]))
print(",".join(["gpu-share.io/real-node=true"] + [f"{k}={v}" for k, v in c.get("labels", {}).items()]))
print(",".join(c.get("taints", [])))
gpus = c["plugin"]["standin"]["gpus"]
print(sum(0 if g.get("mig") else 1 for g in gpus) + sum(len(g.get("mig", [])) for g in gpus))
' "$config")

# ---- kubelet ------------------------------------------------------------------------------------------
kubelet_port=$((10300 + 2 * index))
healthz_port=$((kubelet_port + 1))
cat >"$n/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
failSwapOn: false
cgroupDriver: cgroupfs
cgroupRoot: /gpu-share-$name
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
address: $host_ip
port: $kubelet_port
healthzBindAddress: 127.0.0.1
healthzPort: $healthz_port
readOnlyPort: 0
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: "$pki/ca.crt"}
authorization: {mode: AlwaysAllow}
rotateCertificates: false
serverTLSBootstrap: false
tlsCertFile: "$n/kubelet-serving.crt"
tlsPrivateKeyFile: "$n/kubelet-serving.key"
# Imported images are never pulled again: none may be collected, and the machine's disk is not
# the node's to police.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {"memory.available": "1Mi", "nodefs.available": "1%", "imagefs.available": "1%"}
resolvConf: ""
syncFrequency: 5s
fileCheckFrequency: 5s
nodeStatusUpdateFrequency: 5s
EOF
# The node's cgroup root, in every v1 hierarchy (kubelet requires it to exist); cpuset's new
# cgroups start with no CPUs or memory nodes, so they are given their parent's.
for h in /sys/fs/cgroup/*/; do
  [[ -e $h/cgroup.procs && ! -e $h/cgroup.controllers ]] || continue # v1 hierarchies only
  mkdir -p "$h/gpu-share-$name"
  if [[ -e $h/cpuset.cpus ]]; then
    cat "$h/cpuset.cpus" >"$h/gpu-share-$name/cpuset.cpus"
    cat "$h/cpuset.mems" >"$h/gpu-share-$name/cpuset.mems"
  fi
done
say "kubelet $("$bin/kubelet" --version | awk '{print $2}') on $host_ip:$kubelet_port"
launcher kubelet "$bin/kubelet" --config "$n/kubelet.yaml" --kubeconfig "$n/kubeconfig" \
  --hostname-override "$name" --node-ip "$host_ip" \
  --node-labels "${node_labels[0]}" --register-with-taints "${node_labels[1]}" --v 1
wait_for "node $name Ready" 120 bash -c "\"$KUBECTL\" get node \"$name\" -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].status}' | grep -qx True"
launcher gpu-plugin "$standin/gpu-plugin" serve --config "$n/gpu-plugin.json" --retry-interval 1s
# Ready once kubelet advertises every stand-in device the plugin offers (whole GPUs and MIG).
wait_for "the device plugin's ${node_labels[2]} devices on $name" 60 bash -c "\"$KUBECTL\" get node \"$name\" -o json |
  python3 -c 'import json,sys; a=json.load(sys.stdin)[\"status\"].get(\"allocatable\",{}); sys.exit(sum(int(v) for k,v in a.items() if k.startswith(\"nvidia.com/\")) != int(sys.argv[1]))' ${node_labels[2]}"
say "Ready, $("$KUBECTL" get node "$name" -o json | python3 -c 'import json,sys; a=json.load(sys.stdin)["status"]["allocatable"]; print(", ".join(f"{k}: {v}" for k,v in sorted(a.items()) if k.startswith("nvidia.com/")))')"

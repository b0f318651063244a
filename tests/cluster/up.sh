#!/usr/bin/env bash
# Starts a real Kubernetes control plane on 127.0.0.1 with gpu-share wired in, and returns once
# everything is ready:
#   - etcd, kube-apiserver (RBAC, throwaway certificates and service-account keys, every default
#     admission plugin, an audit log of pod deletes and evictions in DIR/logs/audit.log),
#     kube-controller-manager (its own client certificate and RBAC identity,
#     per-controller ServiceAccounts, as kubeadm runs it: namespaces are deleted for real,
#     Deployments, ReplicaSets, Jobs and StatefulSets create their pods, drained and deleted nodes
#     lose them) and kube-scheduler with the shipped KubeSchedulerConfiguration;
#   - KWOK (tools/kwok) in place of the kubelets, with the stages of tests/cluster/kwok.yaml: the
#     nodes stay Ready with leases, bound pods run, pods annotated
#     pod-complete.stage.kwok.x-k8s.io/delay (or pod-fail...) finish after that delay, deleted
#     pods are gone at once. Nothing runs in a container: there is no container runtime, no
#     device plugin and no GPU;
#   - the shipped manifests (overlays/self-signed, with certificates from `gpu-share certs`)
#     applied, with gpu-share's own Deployments at 0 replicas: the local processes below stand in
#     for their pods;
#   - `gpu-share serve --role webhook` and `--role extender` as local processes with the
#     Deployments' own arguments, each under a TokenRequest token of its own ServiceAccount;
#   - the GPU and CPU nodes of tests/cluster/nodes.yaml (or $GPU_SHARE_CLUSTER_NODES; "none" for
#     none), registered Ready with the allocatable the file gives (KWOK keeps it).
#
# Usage: tests/cluster/up.sh DIR      then   export KUBECONFIG=DIR/kubeconfig
#        tests/cluster/down.sh DIR    stops everything this started, by PID
# DIR/env holds the addresses, ports and paths (KEY=VALUE lines); DIR/logs/ every log;
# DIR/start/NAME.sh starts one gpu-share or scheduler process again (the tests restart them).
# Environment: GPU_SHARE_BIN (a built gpu-share; default: cargo build), GPU_SHARE_CLUSTER_NODES,
# GPU_SHARE_CACHE (the control plane's build cache, default ~/.cache/gpu-share),
# GPU_SHARE_KUBE=1.30 (the control plane of another supported minor, from tests/cluster/v1.30/
# as build.sh builds it; unset: tests/cluster/go.mod's; docs/kubernetes-versions.md),
# GPU_SHARE_CLUSTER_INSTALL=none (the control plane and nodes only: nothing of gpu-share),
# GPU_SHARE_CLUSTER_INSTALL=helm (the Helm chart installed as the README's quick start does, with
# only image.repository set: the webhook keeps its own certificates; the same changes as below
# for the local processes, made on the installed objects),
# GPU_SHARE_CLUSTER_REAL_NODES="real-per-gpu real-mig" (real nodes beside KWOK's, each a kubelet
# with containerd, runc and NVIDIA's runtime, configured by tests/node/nodes/NAME.json, with the
# stand-in GPU stack of tests/node/standin; kube-proxy for their pods; root: tests/node/up.sh and
# docs/real-nodes.md),
# GPU_SHARE_SCHEDULER_REPLICAS=2 (the scheduler Deployment's two replicas, as shipped: two
# kube-schedulers electing a leader on the shipped Lease, each with its own extender, each pair
# under a hostname of its own as a pod has, gpu-share-scheduler-1 and -2 (this needs
# `unshare --uts`, i.e. root); each extender reaches the API through a proxy of its own,
# tests/cluster/apiproxy.py, that the fault runner tests/chaos.rs slows, cuts and expires).
set -euo pipefail
export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"

if [[ $# -ne 1 ]]; then
  echo "usage: $0 DIR" >&2
  exit 2
fi
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
mkdir -p "$1"
dir="$(cd "$1" && pwd)"
if [[ -e $dir/pids ]] && ls "$dir"/pids/*.pid >/dev/null 2>&1; then
  echo "up.sh: $dir already holds a running cluster (run tests/cluster/down.sh $dir first)" >&2
  exit 1
fi
# A cluster is throwaway, certificates and all: a directory used before starts from an empty etcd
# (its old objects, such as a scheduler ConfigMap of another hash, would outlive the certificates
# and keys they were made with).
rm -rf "$dir/etcd-data"
mkdir -p "$dir"/{pids,logs,start,pki,kubeconfigs,policy}
started=$SECONDS
# An up.sh that fails part way stops what it started, so the directory can be used again.
trap 'rc=$?; [[ $rc == 0 ]] || "$here/down.sh" "$dir" >&2; exit $rc' EXIT
say() { echo "up.sh [$((SECONDS - started))s] $*" >&2; }
fail() {
  echo "up.sh: $*" >&2
  for f in "$dir"/logs/*.log; do
    [[ -s $f ]] || continue
    echo "---- last lines of $f" >&2
    tail -n 15 "$f" >&2
  done
  exit 1
}

# ---- binaries ----------------------------------------------------------------------------------
bin="$("$here/build.sh")"
kubectl="$bin/kubectl"
tools="$("$repo/tools/build.sh")"
if [[ -z ${GPU_SHARE_BIN:-} ]]; then
  say "cargo build --bin gpu-share"
  (cd "$repo" && cargo build --locked --quiet --bin gpu-share)
  GPU_SHARE_BIN="$repo/target/debug/gpu-share"
fi
[[ -x $GPU_SHARE_BIN ]] || fail "GPU_SHARE_BIN=$GPU_SHARE_BIN is not an executable"
replicas="${GPU_SHARE_SCHEDULER_REPLICAS:-1}"
case $replicas in
  1) ;;
  2) unshare --uts true 2>/dev/null ||
    fail "GPU_SHARE_SCHEDULER_REPLICAS=2 gives each replica a hostname of its own with unshare --uts, which needs root" ;;
  *) fail "GPU_SHARE_SCHEDULER_REPLICAS=$replicas: 1 or 2" ;;
esac

# ---- real nodes (GPU_SHARE_CLUSTER_REAL_NODES) ----------------------------------------------------
# Pods on a real node reach the API server as pods do, through the `kubernetes` Service: its
# ClusterIP, which kube-proxy forwards to the address the API server advertises. That address is
# the machine's own on a link of its own (gs-api0, a bridge without ports: this kernel has no dummy
# links), reachable from the nodes' pod bridges.
real_nodes="${GPU_SHARE_CLUSTER_REAL_NODES:-}"
host_ip=10.250.0.1
if [[ -n $real_nodes ]]; then
  [[ $(id -u) == 0 ]] || fail "GPU_SHARE_CLUSTER_REAL_NODES: real nodes need root"
  if ip link show gs-api0 >/dev/null 2>&1; then
    fail "link gs-api0 exists: another cluster with real nodes runs on this machine (one at a time), or one was not brought down (tests/cluster/down.sh DIR)"
  fi
  touch "$dir/real-nodes" # down.sh: tests/node/down.sh removes the link and the nodes
  ip link add gs-api0 type bridge
  ip addr add "$host_ip/32" dev gs-api0
  ip link set gs-api0 up
  sysctl -qw net.ipv4.ip_forward=1
fi

# ---- free ports on loopback --------------------------------------------------------------------
# The control plane's and gpu-share's ports; then the second scheduler replica's kube-scheduler,
# extender and admin ports, and each extender's API proxy with its control port (two replicas).
read -r etcd_port etcd_peer_port api_port sched_port webhook_port webhook_admin extender_port extender_admin kcm_port \
  sched_port_2 extender_port_2 extender_admin_2 proxy_port proxy_control proxy_port_2 proxy_control_2 < <(
  python3 "$here/ports.py" 16
)

# ---- certificates and keys ---------------------------------------------------------------------
pki="$dir/pki"
say "certificates"
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=gpu-share-test-cluster-ca" \
  -keyout "$pki/ca.key" -out "$pki/ca.crt" 2>/dev/null
issue() { # name subject san-or-empty extendedKeyUsage
  local name="$1" subject="$2" san="$3" eku="$4"
  {
    echo "basicConstraints=CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    echo "extendedKeyUsage=$eku"
    [[ -n $san ]] && echo "subjectAltName=$san"
  } >"$pki/$name.ext"
  openssl req -newkey rsa:2048 -nodes -subj "$subject" -keyout "$pki/$name.key" -out "$pki/$name.csr" 2>/dev/null
  openssl x509 -req -in "$pki/$name.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
    -days 2 -extfile "$pki/$name.ext" -out "$pki/$name.crt" 2>/dev/null
}
issue apiserver "/CN=kube-apiserver" \
  "IP:127.0.0.1,IP:$host_ip,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc" serverAuth
issue admin "/O=system:masters/CN=gpu-share-test-admin" "" clientAuth
# kube-controller-manager's identity, as kubeadm gives it: the user system:kube-controller-manager,
# bound by the built-in ClusterRoleBinding of the same name.
issue controller-manager "/CN=system:kube-controller-manager" "" clientAuth
# The extenders' API proxy (two replicas only) serves as the API server does, for 127.0.0.1.
[[ $replicas == 2 ]] && issue apiproxy "/CN=gpu-share-test-apiproxy" "IP:127.0.0.1" serverAuth
openssl genrsa -out "$pki/sa.key" 2048 2>/dev/null
openssl rsa -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null
# gpu-share's own: the CA and serving certificate a user makes with `gpu-share certs`.
"$GPU_SHARE_BIN" certs --namespace gpu-share --service gpu-share --out "$dir/gpu-share-certs" --days 2 \
  >"$dir/logs/gpu-share-certs.out"

# ---- process helpers ---------------------------------------------------------------------------
# Each process gets DIR/start/NAME.sh, which starts it detached with its log in DIR/logs/NAME.log
# and its PID in DIR/pids/NAME.pid; down.sh kills those PIDs.
launcher() { # name command...
  local name="$1"
  shift
  {
    echo "#!/usr/bin/env bash"
    echo "# Starts $name detached (written by tests/cluster/up.sh)."
    printf 'cd %q\n' "$dir"
    [[ -n ${launch_env:-} ]] && echo "export $launch_env"
    printf 'setsid'
    printf ' %q' "$@"
    printf ' >>%q 2>&1 </dev/null &\n' "$dir/logs/$name.log"
    printf 'echo $! >%q\n' "$dir/pids/$name.pid"
  } >"$dir/start/$name.sh"
  chmod +x "$dir/start/$name.sh"
  "$dir/start/$name.sh"
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

# ---- etcd ----------------------------------------------------------------------------------------
say "etcd on 127.0.0.1:$etcd_port"
launch_env="" launcher etcd "$bin/etcd" --name gpu-share-test --data-dir "$dir/etcd-data" \
  --listen-client-urls "http://127.0.0.1:$etcd_port" --advertise-client-urls "http://127.0.0.1:$etcd_port" \
  --listen-peer-urls "http://127.0.0.1:$etcd_peer_port" \
  --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer_port" \
  --initial-cluster "gpu-share-test=http://127.0.0.1:$etcd_peer_port" \
  --quota-backend-bytes 4294967296 --unsafe-no-fsync --log-level warn
wait_for etcd 60 curl -sf "http://127.0.0.1:$etcd_port/health"

# ---- kube-apiserver ------------------------------------------------------------------------------
say "kube-apiserver on 127.0.0.1:$api_port"
# With real nodes it also listens on the machine's own address and advertises it: the
# `kubernetes` Service's endpoint, kept by the API server's lease reconciler.
if [[ -n $real_nodes ]]; then
  # The API server's client certificate for kubelets (logs, exec), as kubeadm's
  # apiserver-kubelet-client.
  issue apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" "" clientAuth
  api_address=(--bind-address 0.0.0.0 --advertise-address "$host_ip" --kubelet-preferred-address-types InternalIP
    --kubelet-client-certificate "$pki/apiserver-kubelet-client.crt" --kubelet-client-key "$pki/apiserver-kubelet-client.key"
    --kubelet-certificate-authority "$pki/ca.crt")
else
  api_address=(--bind-address 127.0.0.1 --advertise-address 127.0.0.1 --endpoint-reconciler-type none)
fi
# The audit log keeps how pods are removed (deletes, and evictions through the Eviction API), so
# a test can tell which identity removed which pod how (defragmentation evicts, never deletes).
cat >"$dir/audit-policy.yaml" <<'AUDIT'
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
    verbs: [delete, deletecollection]
    resources: [{group: "", resources: [pods]}]
  - level: Metadata
    verbs: [create]
    resources: [{group: "", resources: [pods/eviction]}]
  - level: None
AUDIT
launch_env="" launcher kube-apiserver "$bin/kube-apiserver" \
  --audit-policy-file "$dir/audit-policy.yaml" --audit-log-path "$dir/logs/audit.log" \
  --etcd-servers "http://127.0.0.1:$etcd_port" \
  "${api_address[@]}" --secure-port "$api_port" \
  --tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key" \
  --client-ca-file "$pki/ca.crt" \
  --authorization-mode Node,RBAC \
  --allow-privileged=true \
  --service-account-key-file "$pki/sa.pub" --service-account-signing-key-file "$pki/sa.key" \
  --service-account-issuer https://kubernetes.default.svc.cluster.local \
  --service-cluster-ip-range 10.96.0.0/16 \
  --profiling=false --v 1

admin_kubeconfig() { # file user-stanza-lines...
  local file="$1"
  shift
  cat >"$file" <<EOF
apiVersion: v1
kind: Config
clusters:
  - name: gpu-share-test
    cluster:
      server: https://127.0.0.1:$api_port
      certificate-authority: $pki/ca.crt
contexts:
  - name: gpu-share-test
    context: {cluster: gpu-share-test, user: user}
current-context: gpu-share-test
users:
  - name: user
    user:
$(printf '      %s\n' "$@")
EOF
  chmod 600 "$file"
}
admin_kubeconfig "$dir/kubeconfig" "client-certificate: $pki/admin.crt" "client-key: $pki/admin.key"
export KUBECONFIG="$dir/kubeconfig"
wait_for kube-apiserver 120 "$kubectl" get --raw /readyz
say "kube-apiserver ready ($("$kubectl" get --raw /version | python3 -c 'import json, sys; print(json.load(sys.stdin)["gitVersion"])'))"

# ---- kube-controller-manager, as kubeadm runs it --------------------------------------------------
admin_kubeconfig "$dir/kubeconfigs/controller-manager" \
  "client-certificate: $pki/controller-manager.crt" "client-key: $pki/controller-manager.key"
say "kube-controller-manager on 127.0.0.1:$kcm_port"
launch_env="" launcher kube-controller-manager "$bin/kube-controller-manager" \
  --kubeconfig "$dir/kubeconfigs/controller-manager" \
  --authentication-kubeconfig "$dir/kubeconfigs/controller-manager" \
  --authorization-kubeconfig "$dir/kubeconfigs/controller-manager" \
  --bind-address 127.0.0.1 --secure-port "$kcm_port" \
  --client-ca-file "$pki/ca.crt" --root-ca-file "$pki/ca.crt" \
  --cluster-signing-cert-file "$pki/ca.crt" --cluster-signing-key-file "$pki/ca.key" \
  --service-account-private-key-file "$pki/sa.key" --use-service-account-credentials=true \
  --controllers '*,bootstrapsigner,tokencleaner' --cluster-name kubernetes \
  --leader-elect=true --profiling=false --v 1

# ---- KWOK: the kubelets --------------------------------------------------------------------------
# Every node is KWOK's but the real ones (labelled gpu-share.io/real-node). Node and pod addresses
# are made-up labels (nothing connects to them).
say "kwok (tests/cluster/kwok.yaml)"
launch_env="" launcher kwok "$tools/kwok" --kubeconfig "$dir/kubeconfig" --config "$here/kwok.yaml" \
  --manage-nodes-with-label-selector '!gpu-share.io/real-node' --node-lease-duration-seconds 40 \
  --node-ip 127.0.0.1 --cidr 127.128.0.0/12

register_nodes() {
  local nodes="${GPU_SHARE_CLUSTER_NODES:-$here/nodes.yaml}"
  if [[ $nodes != none ]]; then
    say "nodes from $nodes"
    python3 "$here/nodes.py" "$dir" "$nodes"
  fi
}

# DIR/env's lines for the control plane itself (the gpu-share ones follow when it runs).
control_plane_env() {
  cat <<EOF
GPU_SHARE_CLUSTER_DIR=$dir
KUBECONFIG=$dir/kubeconfig
KUBECTL=$kubectl
CONTROL_PLANE_BIN=$bin
API_SERVER=https://127.0.0.1:$api_port
ETCD=http://127.0.0.1:$etcd_port
EOF
}

# The real nodes of GPU_SHARE_CLUSTER_REAL_NODES (tests/node/up.sh), once DIR/env is written, and
# kube-proxy, one for the machine (the nodes share its network), as system:kube-proxy.
start_real_nodes() {
  [[ -n $real_nodes ]] || return 0
  issue kube-proxy "/CN=system:kube-proxy" "" clientAuth
  admin_kubeconfig "$dir/kubeconfigs/kube-proxy" \
    "client-certificate: $pki/kube-proxy.crt" "client-key: $pki/kube-proxy.key"
  local first="${real_nodes%% *}" health metrics
  read -r health metrics < <(python3 "$here/ports.py" 2)
  cat >"$dir/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: "$dir/kubeconfigs/kube-proxy"}
mode: iptables
hostnameOverride: "$first"
clusterCIDR: 10.88.0.0/16
bindAddress: 127.0.0.1
healthzBindAddress: 127.0.0.1:$health
metricsBindAddress: 127.0.0.1:$metrics
conntrack: {maxPerCore: 0}
oomScoreAdj: 0
EOF
  local node_bin
  node_bin="$("$repo/tests/node/build.sh")"
  say "kube-proxy (iptables) for the real nodes"
  launch_env="" launcher kube-proxy "$node_bin/kube-proxy" --config "$dir/kube-proxy.yaml" --v 1
  # The runtime class NVIDIA's GPU Operator creates for its runtime handler.
  "$kubectl" apply -f - >/dev/null <<EOF
apiVersion: node.k8s.io/v1
kind: RuntimeClass
metadata: {name: nvidia}
handler: nvidia
EOF
  local images
  images="$(GPU_SHARE_BIN="$GPU_SHARE_BIN" "$repo/tests/node/images.sh" "$dir")" || fail "tests/node/images.sh"
  local index=1 node
  for node in $real_nodes; do
    GPU_SHARE_NODE_HOST_IP=$host_ip GPU_SHARE_NODE_IMAGES="$images" \
      "$repo/tests/node/up.sh" "$dir" "$node" "$index" || fail "real node $node did not start"
    index=$((index + 1))
  done
}

# GPU_SHARE_CLUSTER_INSTALL=none: the control plane and the nodes only, for installing gpu-share
# by hand (the README's commands: tests/readme/check.py). Nothing of gpu-share is applied or run.
if [[ ${GPU_SHARE_CLUSTER_INSTALL:-shipped} == none ]]; then
  register_nodes
  control_plane_env >"$dir/env"
  start_real_nodes
  say "ready (control plane only): export KUBECONFIG=$dir/kubeconfig KUBECTL=$kubectl"
  exit 0
fi

install="${GPU_SHARE_CLUSTER_INSTALL:-shipped}"
[[ $install == shipped || $install == helm ]] || fail "GPU_SHARE_CLUSTER_INSTALL=$install: none, shipped or helm"
if [[ $install == helm ]]; then
# ---- the Helm chart, as a new user installs it -----------------------------------------------------
"$kubectl" create namespace gpu-share >/dev/null
"$kubectl" label namespace gpu-share pod-security.kubernetes.io/enforce=restricted \
  pod-security.kubernetes.io/warn=restricted pod-security.kubernetes.io/audit=restricted >/dev/null
say "helm install (the chart's defaults, image.repository alone set)"
KUBECONFIG="$dir/kubeconfig" "$tools/helm" install gpu-share "$repo/charts/gpu-share" --namespace gpu-share \
  --set image.repository=registry.example.com/platform/gpu-share >"$dir/logs/helm.out" 2>&1 ||
  fail "helm install failed: $(cat "$dir/logs/helm.out")"
# The changes, on the installed objects: the webhooks call the local process by URL (the webhook
# sets their caBundle itself, as it does in a pod), and gpu-share's Deployments run no pods.
"$kubectl" get mutatingwebhookconfiguration/gpu-share validatingwebhookconfiguration/gpu-share -o json |
  python3 -c '
import json, sys
objs = json.load(sys.stdin)
for d in objs["items"]:
    for hook in d["webhooks"]:
        cc = hook["clientConfig"]
        assert "caBundle" not in cc, "the chart set a caBundle: the webhook keeps its own"
        cc["url"] = sys.argv[1] + cc.pop("service")["path"]
json.dump(objs, sys.stdout)
' "https://127.0.0.1:$webhook_port" | "$kubectl" replace -f - >/dev/null || fail "the webhooks' URLs"
"$kubectl" -n gpu-share scale deployment gpu-share-webhook gpu-share-scheduler --replicas 0 >/dev/null
mkdir -p "$dir/tls"
else
# ---- the manifests, as shipped -------------------------------------------------------------------
# The self-signed overlay reads its certificates from its own certs/ directory: render a copy.
rm -rf "$dir/manifests"
cp -r "$repo/manifests" "$dir/manifests"
mkdir -p "$dir/manifests/overlays/self-signed/certs"
cp "$dir/gpu-share-certs"/{ca.crt,tls.crt,tls.key} "$dir/manifests/overlays/self-signed/certs/"
# With per-GPU sharing's objects (the component), which the per-GPU points and the fault runner use.
mkdir -p "$dir/manifests/test"
printf '%s\n' 'apiVersion: kustomize.config.k8s.io/v1beta1' 'kind: Kustomization' \
  'resources: [../overlays/self-signed]' 'components: [../components/per-gpu, ../components/per-gpu-mps]' \
  >"$dir/manifests/test/kustomization.yaml"
"$kubectl" kustomize "$dir/manifests/test" >"$dir/rendered.yaml"
# The changes: the webhooks call the local process by URL, trusting the test CA (the self-signed
# overlay already set caBundle to it), and gpu-share's Deployments run no pods (the local
# processes are them; their pods would wait for a scheduler profile of their own).
python3 - "$dir/rendered.yaml" "$dir/applied.yaml" "https://127.0.0.1:$webhook_port" <<'EOF'
import sys, yaml
src, dst, base = sys.argv[1:]
docs = [d for d in yaml.safe_load_all(open(src)) if d]
for d in docs:
    if d["kind"] in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        for hook in d["webhooks"]:
            cc = hook["clientConfig"]
            path = cc.pop("service")["path"]
            cc["url"] = base + path
    if d["kind"] == "Deployment" and d["metadata"].get("namespace") == "gpu-share":
        d["spec"]["replicas"] = 0
yaml.safe_dump_all(docs, open(dst, "w"), sort_keys=False)
EOF
say "kubectl apply (the self-signed overlay, with the per-GPU component)"
"$kubectl" apply -f "$dir/applied.yaml" >"$dir/logs/apply.out" 2>"$dir/logs/apply.err" ||
  fail "kubectl apply of the manifests failed: $(cat "$dir/logs/apply.err")"
mkdir -p "$dir/tls"
fi

# ---- gpu-share's processes under their own ServiceAccounts -------------------------------------
token_kubeconfig() { # serviceaccount file
  local token
  token="$("$kubectl" -n gpu-share create token "$1" --duration 48h)"
  admin_kubeconfig "$2" "token: $token"
}
token_kubeconfig gpu-share-webhook "$dir/kubeconfigs/webhook"
token_kubeconfig gpu-share-scheduler "$dir/kubeconfigs/scheduler"

# What the pods mount, as files: the Secret gpu-share-tls (where the webhook does not keep its own
# certificates: it writes its files itself) and the policy ConfigMap.
if [[ $install == shipped ]]; then
  for key in tls.crt tls.key ca.crt; do
    "$kubectl" -n gpu-share get secret gpu-share-tls -o "jsonpath={.data.${key//./\\.}}" | base64 -d >"$dir/tls/$key"
  done
  chmod 600 "$dir/tls/tls.key"
fi
"$kubectl" -n gpu-share get configmap gpu-share-policy -o 'jsonpath={.data.policy\.yaml}' >"$dir/policy/policy.yaml"

# A container's args from the applied Deployment, with the mount paths and listen addresses of
# this machine: the ones the Deployment runs with, no others.
# The scheduler pod's /etc/gpu-share/tls is its own (the init container loopback-tls fills it):
# here $dir/scheduler-tls.
deployment_args() { # deployment container listen admin-listen
  "$kubectl" -n gpu-share get deployment "$1" -o json | python3 -c '
import json, sys
d = json.load(sys.stdin)
name, listen, admin, root, deployment = sys.argv[1:]
spec = d["spec"]["template"]["spec"]
c = next(c for c in spec["containers"] + spec.get("initContainers", []) if c["name"] == name)
args = list(c["args"])
def put(flag, value):
    if flag in args:
        args[args.index(flag) + 1] = value
    else:
        args.extend([flag, value])
if listen:
    put("--listen", listen)
    put("--admin-listen", admin)
def local(a):
    if deployment == "gpu-share-scheduler":
        a = a.replace("/etc/gpu-share/tls", root + "/scheduler-tls")
    return a.replace("/etc/gpu-share/", root + "/")
print("\n".join(local(a) for a in args))
' "$2" "$3" "$4" "$dir" "$1"
}
mapfile -t webhook_args < <(deployment_args gpu-share-webhook webhook "127.0.0.1:$webhook_port" "127.0.0.1:$webhook_admin")
mapfile -t extender_args < <(deployment_args gpu-share-scheduler extender "127.0.0.1:$extender_port" "127.0.0.1:$extender_admin")
[[ ${webhook_args[0]:-} == serve && ${extender_args[0]:-} == serve ]] || fail "unexpected Deployment args"

say "gpu-share webhook on 127.0.0.1:$webhook_port"
launch_env="KUBECONFIG=$dir/kubeconfigs/webhook" launcher webhook "$GPU_SHARE_BIN" "${webhook_args[@]}"

# ---- the scheduler replicas: kube-scheduler with the shipped configuration, and its extender ----
# The scheduler pod's init container first: the loopback's CA and certificate.
mapfile -t loopback_args < <(deployment_args gpu-share-scheduler loopback-tls "" "")
[[ ${loopback_args[0]:-} == certs ]] || fail "unexpected loopback-tls init container args"
"$GPU_SHARE_BIN" "${loopback_args[@]}" >"$dir/logs/loopback-tls.log" 2>&1 || fail "loopback-tls: $(cat "$dir/logs/loopback-tls.log")"
# The configuration changes: the kubeconfig, the extender's address and its CA file. Nothing else.
scheduler_config() { # extender-port out
  "$kubectl" -n gpu-share get configmap -l app.kubernetes.io/component=scheduler -o json | python3 -c '
import json, sys, yaml
items = json.load(sys.stdin)["items"]
cms = [c for c in items if "scheduler-config.yaml" in c.get("data", {})]
assert len(cms) == 1, f"expected one scheduler ConfigMap, found {len(cms)}"
cfg = yaml.safe_load(cms[0]["data"]["scheduler-config.yaml"])
kubeconfig, url, ca, out = sys.argv[1:]
cfg["clientConnection"]["kubeconfig"] = kubeconfig
assert len(cfg["extenders"]) == 1
cfg["extenders"][0]["urlPrefix"] = url
cfg["extenders"][0]["tlsConfig"]["caFile"] = ca
yaml.safe_dump(cfg, open(out, "w"), sort_keys=False)
' "$dir/kubeconfigs/scheduler" "https://127.0.0.1:$1/scheduler" "$dir/scheduler-tls/ca.crt" "$2"
}

# One replica: kube-scheduler and extender (process names with suffix "" or "-2"). With two,
# both run under the replica's hostname, as the containers of one pod share theirs: kube-scheduler
# takes it as its Lease holder identity, and the extender leads the reservations when the holder
# is its own pod.
scheduler_replica() { # suffix scheduler-port extender-port extender-admin proxy-port proxy-control
  local suffix="$1" sport="$2" eport="$3" eadmin="$4" pport="$5" pcontrol="$6"
  local kubeconfig="$dir/kubeconfigs/scheduler" host=() args
  if [[ $replicas == 2 ]]; then
    local name="gpu-share-scheduler-${suffix#-}"
    [[ -z $suffix ]] && name=gpu-share-scheduler-1
    host=(unshare --uts sh -c 'hostname "$0" && exec "$@"' "$name")
    # The extender's API connection goes through its proxy (the kube-scheduler's does not).
    kubeconfig="$dir/kubeconfigs/extender$suffix"
    sed "s#server: https://127.0.0.1:$api_port#server: https://127.0.0.1:$pport#" \
      "$dir/kubeconfigs/scheduler" >"$kubeconfig"
    chmod 600 "$kubeconfig"
    launch_env="" launcher "apiproxy$suffix" python3 "$here/apiproxy.py" --listen "$pport" --control "$pcontrol" \
      --upstream "127.0.0.1:$api_port" --cert "$pki/apiproxy.crt" --key "$pki/apiproxy.key" --ca "$pki/ca.crt"
    wait_for "API proxy$suffix" 30 curl -sf "http://127.0.0.1:$pcontrol/stats"
    say "$name: kube-scheduler on 127.0.0.1:$sport, extender on 127.0.0.1:$eport (API through 127.0.0.1:$pport)"
  else
    say "kube-scheduler on 127.0.0.1:$sport, extender on 127.0.0.1:$eport"
  fi
  mapfile -t args < <(deployment_args gpu-share-scheduler extender "127.0.0.1:$eport" "127.0.0.1:$eadmin")
  [[ ${args[0]:-} == serve ]] || fail "unexpected Deployment args"
  local pod_env=""
  [[ $replicas == 2 ]] && pod_env=" POD_NAME=${name} POD_NAMESPACE=gpu-share"
  # Real nodes run the reservation pods: gpu-share's image of this build (tests/node/images.sh).
  [[ -n $real_nodes ]] && pod_env+=" GPU_SHARE_RESERVATION_IMAGE=gpu-share.test/gpu-share:dev"
  launch_env="KUBECONFIG=$kubeconfig$pod_env" launcher "extender$suffix" "${host[@]}" "$GPU_SHARE_BIN" "${args[@]}"
  scheduler_config "$eport" "$dir/scheduler-config$suffix.yaml"
  launch_env="" launcher "kube-scheduler$suffix" "${host[@]}" "$bin/kube-scheduler" \
    --config "$dir/scheduler-config$suffix.yaml" \
    --bind-address 127.0.0.1 --secure-port "$sport" \
    --authentication-kubeconfig "$dir/kubeconfigs/scheduler" \
    --authorization-kubeconfig "$dir/kubeconfigs/scheduler" \
    --v 2
}
scheduler_replica "" "$sched_port" "$extender_port" "$extender_admin" "$proxy_port" "$proxy_control"
if [[ $replicas == 2 ]]; then
  scheduler_replica -2 "$sched_port_2" "$extender_port_2" "$extender_admin_2" "$proxy_port_2" "$proxy_control_2"
fi

# ---- nodes ---------------------------------------------------------------------------------------
register_nodes

# ---- ready ---------------------------------------------------------------------------------------
wait_for "gpu-share webhook /readyz" 120 curl -sf "http://127.0.0.1:$webhook_admin/readyz"
wait_for "gpu-share extender /readyz" 120 curl -sf "http://127.0.0.1:$extender_admin/readyz"
wait_for "kube-scheduler /healthz" 120 curl -sfk "https://127.0.0.1:$sched_port/healthz"
if [[ $replicas == 2 ]]; then
  wait_for "gpu-share extender-2 /readyz" 120 curl -sf "http://127.0.0.1:$extender_admin_2/readyz"
  wait_for "kube-scheduler-2 /healthz" 120 curl -sfk "https://127.0.0.1:$sched_port_2/healthz"
fi
holder() { "$kubectl" -n gpu-share get lease gpu-share-scheduler -o 'jsonpath={.spec.holderIdentity}'; }
lease_wait=$SECONDS
until [[ -n $(holder 2>/dev/null) ]]; do
  ((SECONDS - lease_wait < 60)) || fail "kube-scheduler did not take Lease gpu-share/gpu-share-scheduler within 60 s"
  sleep 0.3
done

{
  control_plane_env
  cat <<EOF
GPU_SHARE_BIN=$GPU_SHARE_BIN
SCHEDULER=https://127.0.0.1:$sched_port
WEBHOOK=https://127.0.0.1:$webhook_port
WEBHOOK_ADMIN=http://127.0.0.1:$webhook_admin
EXTENDER=https://127.0.0.1:$extender_port
EXTENDER_ADMIN=http://127.0.0.1:$extender_admin
GPU_SHARE_CA=$dir/tls/ca.crt
EXTENDER_CA=$dir/scheduler-tls/ca.crt
GPU_SHARE_E2E_READYZ=http://127.0.0.1:$webhook_admin/readyz,http://127.0.0.1:$extender_admin/readyz
SCHEDULER_REPLICAS=$replicas
EOF
  if [[ $replicas == 2 ]]; then
    cat <<EOF
SCHEDULER_2=https://127.0.0.1:$sched_port_2
EXTENDER_2=https://127.0.0.1:$extender_port_2
EXTENDER_ADMIN_2=http://127.0.0.1:$extender_admin_2
APIPROXY_CONTROL=http://127.0.0.1:$proxy_control
APIPROXY_CONTROL_2=http://127.0.0.1:$proxy_control_2
EOF
  fi
} >"$dir/env"
start_real_nodes
say "ready: export KUBECONFIG=$dir/kubeconfig KUBECTL=$kubectl"

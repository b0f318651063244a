#!/usr/bin/env bash
# Installs Kueue on a control plane of tests/cluster/up.sh DIR as its own manifests install it,
# and runs its controller manager (controller and webhooks) as a local process, as up.sh runs
# gpu-share's:
#   - the manifests: Kueue's `config/default` from its Go module (tools/kueue pins the version),
#     rendered with kubectl kustomize: its CRDs, RBAC, Namespace kueue-system, the Configuration
#     ConfigMap with the frameworks it ships (batch/job and pod among them), and its two webhook
#     configurations;
#   - the process: the binary tools/build.sh builds (`kueue`, from the same module), with the
#     Deployment's own arguments (--config, --zap-log-level), under a TokenRequest token of its
#     ServiceAccount kueue-system/kueue-controller-manager, so it acts with the RBAC its manifests
#     grant.
# What changes, because nothing runs in a pod here (no container runtime, no Service routing):
#   - the webhook configurations call the local process by URL (https://127.0.0.1:PORT/path), not
#     Service kueue-webhook-service;
#   - the Configuration: internalCertManagement off (Kueue's documented mode for certificates it
#     does not make, as with cert-manager; its own would name only the Service's DNS name), the
#     serving certificate from `gpu-share certs` for that Service and 127.0.0.1, the ports
#     (webhook, health, metrics) free ones on loopback, the leader election Lease's namespace
#     (a pod reads it from its ServiceAccount's mount), and what docs/quotas.md
#     tells a user to set (its block marked `<!-- example: kueue-configuration -->`, as written);
#     the rest as shipped;
#   - the Deployment runs 0 replicas (the local process stands in for its pod);
#   - the metrics endpoint's certificate (the same one) is where Kueue's code looks for it, in a
#     mount namespace of the process's own (root, as up.sh's two scheduler replicas need);
#   - the visibility API is off: its APIServices (v1beta1/v1beta2.visibility.kueue.x-k8s.io) are
#     left out, since they route through a Service and an unavailable aggregated API stalls
#     discovery and namespace deletion for every test on the cluster, and so is its server
#     (--feature-gates=VisibilityOnDemand=false, a beta gate), which would want certificates in
#     /visibility, where the pod mounts them.
#
# Usage: tests/cluster/kueue.sh DIR [--first]
#          --first: Kueue's MutatingWebhookConfiguration is named to sort before gpu-share's
#          (0-kueue-mutating-webhook-configuration), so the API server calls Kueue's mutating
#          webhooks before gpu-share's; without it the shipped name sorts after (the API server
#          calls mutating webhook configurations in the order of their names)
#        tests/cluster/kueue.sh DIR --remove
#          deletes Kueue's webhook configurations and stops the process (its CRDs and objects
#          stay), so pods no longer wait on a webhook that is gone
# Writes DIR/kueue/env (KUEUE_HEALTH, KUEUE_WEBHOOK, KUEUE_MUTATING: the configuration's name),
# logs to DIR/logs/kueue.log; DIR/pids/kueue.pid is stopped by down.sh.
set -euo pipefail
export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"
if [[ $# -lt 1 || $# -gt 2 ]]; then
  echo "usage: $0 DIR [--first|--remove]" >&2
  exit 2
fi
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
dir="$(cd "$1" && pwd)"
mode="${2:-}"
started=$SECONDS
say() { echo "kueue.sh [$((SECONDS - started))s] $*" >&2; }
fail() {
  say "FAILED: $*"
  exit 1
}
[[ -f $dir/env ]] || fail "$dir/env not found: start the cluster with tests/cluster/up.sh $dir first"
kubectl="$(sed -n 's/^KUBECTL=//p' "$dir/env")"
export KUBECONFIG="$dir/kubeconfig"
gpu_share_bin="$(sed -n 's/^GPU_SHARE_BIN=//p' "$dir/env")"
k="$dir/kueue"
mkdir -p "$k"

stop() {
  local f="$dir/pids/kueue.pid"
  [[ -f $f ]] || return 0
  local pid
  pid="$(cat "$f")"
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
  kill -KILL "$pid" 2>/dev/null || true
  rm -f "$f"
}

if [[ $mode == --remove ]]; then
  "$kubectl" delete mutatingwebhookconfiguration kueue-mutating-webhook-configuration \
    0-kueue-mutating-webhook-configuration --ignore-not-found >&2
  "$kubectl" delete validatingwebhookconfiguration kueue-validating-webhook-configuration \
    --ignore-not-found >&2
  stop
  say "removed: webhook configurations deleted, process stopped"
  exit 0
fi
[[ -z $mode || $mode == --first ]] || fail "unknown option $mode"
stop

tools="$("$repo/tools/build.sh")"
module="$(cd "$repo/tools/kueue" && go list -m -f '{{.Dir}}' sigs.k8s.io/kueue)"
version="$(cd "$repo/tools/kueue" && go list -m -f '{{.Version}}' sigs.k8s.io/kueue)"
"$kubectl" kustomize "$module/config/default" >"$k/rendered.yaml"

read -r webhook_port health_port metrics_port < <(
  python3 "$here/ports.py" 3
)
rm -rf "$k/certs"
"$gpu_share_bin" certs --namespace kueue-system --service kueue-webhook-service --out "$k/certs" \
  --days 2 >"$k/certs.out"
mutating=kueue-mutating-webhook-configuration
[[ $mode == --first ]] && mutating=0-kueue-mutating-webhook-configuration

python3 - "$k/rendered.yaml" "$k/applied.yaml" "$k/config.yaml" "https://127.0.0.1:$webhook_port" \
  "$k/certs" "$health_port" "$metrics_port" "$mutating" "$repo/docs/quotas.md" <<'EOF'
import base64, re, sys, yaml
src, dst, config_out, base, certs, health, metrics, mutating, quotas = sys.argv[1:]

def quotas_block(name):
    """The YAML block that follows `<!-- example: NAME -->` in docs/quotas.md."""
    m = re.search(r"<!-- example: " + re.escape(name) + r" -->\n```yaml\n(.*?)\n```", open(quotas).read(), re.S)
    if not m:
        sys.exit(f"docs/quotas.md has no yaml block marked <!-- example: {name} -->")
    return yaml.safe_load(m.group(1))

ca = base64.b64encode(open(f"{certs}/ca.crt", "rb").read()).decode()
docs = [d for d in yaml.safe_load_all(open(src)) if d]
out = []
for d in docs:
    kind, name = d["kind"], d["metadata"]["name"]
    if kind == "APIService":
        continue
    if kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        if kind == "MutatingWebhookConfiguration":
            d["metadata"]["name"] = mutating
        for hook in d["webhooks"]:
            cc = hook["clientConfig"]
            cc["url"] = base + cc.pop("service")["path"]
            cc["caBundle"] = ca
    if kind == "Deployment" and name == "kueue-controller-manager":
        d["spec"]["replicas"] = 0
    if kind == "ConfigMap" and name == "kueue-manager-config":
        cfg = yaml.safe_load(d["data"]["controller_manager_config.yaml"])
        cfg["internalCertManagement"] = {"enable": False}
        cfg["webhook"] = {"port": int(base.rsplit(":", 1)[1]), "host": "127.0.0.1", "certDir": certs}
        cfg["health"]["healthProbeBindAddress"] = f"127.0.0.1:{health}"
        cfg["metrics"]["bindAddress"] = f"127.0.0.1:{metrics}"
        # In a pod, the Lease's namespace is read from the ServiceAccount's mount.
        cfg["leaderElection"]["resourceNamespace"] = "kueue-system"
        # What docs/quotas.md tells a user to set in Kueue's Configuration, as written there.
        cfg.update(quotas_block("kueue-configuration"))
        text = yaml.safe_dump(cfg, sort_keys=False)
        d["data"]["controller_manager_config.yaml"] = text
        open(config_out, "w").write(text)
    out.append(d)
yaml.safe_dump_all(out, open(dst, "w"), sort_keys=False)
EOF

# One mutating configuration at a time: the other name's, from an earlier run, goes.
other=0-kueue-mutating-webhook-configuration
[[ $mode == --first ]] && other=kueue-mutating-webhook-configuration
"$kubectl" delete mutatingwebhookconfiguration "$other" --ignore-not-found >/dev/null
say "kubectl apply (Kueue $version's config/default, ${mutating})"
# The CRDs first, established before the objects that need them.
"$kubectl" apply --server-side -f "$k/applied.yaml" >"$k/apply.out" 2>"$k/apply.err" ||
  fail "kubectl apply of Kueue's manifests failed: $(cat "$k/apply.err")"
"$kubectl" wait --for condition=established --timeout=60s crd/clusterqueues.kueue.x-k8s.io \
  crd/localqueues.kueue.x-k8s.io crd/resourceflavors.kueue.x-k8s.io crd/workloads.kueue.x-k8s.io >&2

token="$("$kubectl" -n kueue-system create token kueue-controller-manager --duration 48h)"
server="$(sed -n 's/^API_SERVER=//p' "$dir/env")"
ca_file="$(python3 -c 'import sys, yaml; c = yaml.safe_load(open(sys.argv[1])); print(c["clusters"][0]["cluster"].get("certificate-authority", ""))' "$dir/kubeconfig")"
cat >"$k/kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters: [{name: test, cluster: {server: "$server", certificate-authority: "$ca_file"}}]
users: [{name: kueue, user: {token: "$token"}}]
contexts: [{name: kueue, context: {cluster: test, user: kueue}}]
current-context: kueue
EOF
[[ -n $ca_file ]] || fail "no certificate-authority file in $dir/kubeconfig"

# The Deployment's own arguments, its config file a local path.
mapfile -t args < <(python3 - "$k/applied.yaml" "$k/config.yaml" <<'EOF'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
dep = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "kueue-controller-manager")
c = next(c for c in dep["spec"]["template"]["spec"]["containers"] if c["name"] == "manager")
for a in c.get("args", []):
    print(f"--config={sys.argv[2]}" if a.startswith("--config=") else a)
EOF
)
say "kueue ${args[*]} (webhooks on 127.0.0.1:$webhook_port)"
# Without its internal certificate management Kueue reads the metrics endpoint's certificate from
# /etc/kueue/metrics/certs, a path its code fixes (cmd/kueue/main.go), where a pod mounts a
# Secret. Here it sees that directory in a mount namespace of its own: a read-only overlay of
# this machine's /etc with the directory on top, so nothing of the machine's /etc changes.
rm -rf "$k/etc"
mkdir -p "$k/etc/kueue/metrics/certs"
cp "$k/certs/tls.crt" "$k/certs/tls.key" "$k/etc/kueue/metrics/certs/"
(
  cd "$k"
  KUBECONFIG="$k/kubeconfig" setsid unshare --mount --propagation private -- \
    sh -c 'mount -t overlay kueue-etc -o "lowerdir=$0:/etc" /etc && exec "$@"' "$k/etc" \
    "$tools/kueue" "${args[@]}" --feature-gates=VisibilityOnDemand=false \
    >>"$dir/logs/kueue.log" 2>&1 </dev/null &
  echo $! >"$dir/pids/kueue.pid"
)
deadline=$((SECONDS + 120))
until curl -sf "http://127.0.0.1:$health_port/readyz" >/dev/null 2>&1; do
  kill -0 "$(cat "$dir/pids/kueue.pid")" 2>/dev/null || fail "kueue exited: $(tail -20 "$dir/logs/kueue.log")"
  ((SECONDS < deadline)) || fail "kueue /readyz not ready after 120 s: $(tail -20 "$dir/logs/kueue.log")"
  sleep 0.5
done
# Its webhooks answer: a ResourceFlavor goes through Kueue's own mutating and validating webhooks.
deadline=$((SECONDS + 60))
until "$kubectl" create --dry-run=server -f - >/dev/null 2>"$k/probe.err" <<'EOF'
apiVersion: kueue.x-k8s.io/v1beta2
kind: ResourceFlavor
metadata: {name: kueue-sh-probe}
EOF
do
  ((SECONDS < deadline)) || fail "Kueue's webhooks do not answer: $(cat "$k/probe.err")"
  sleep 0.5
done
{
  echo "KUEUE_VERSION=$version"
  echo "KUEUE_HEALTH=http://127.0.0.1:$health_port"
  echo "KUEUE_WEBHOOK=https://127.0.0.1:$webhook_port"
  echo "KUEUE_MUTATING=$mutating"
} >"$k/env"
say "ready: Kueue $version, $mutating"

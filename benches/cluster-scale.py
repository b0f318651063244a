#!/usr/bin/env python3
"""gpu-share's scheduler against kube-scheduler's default profile, at scale, on the control
plane of tests/cluster/up.sh (real kube-apiserver, etcd and kube-scheduler).

    python3 benches/cluster-scale.py [--nodes 5000] [--pods 20000] [--out benches/results/cluster-scale.md]

1. Starts the control plane with N GPU nodes of mixed kinds (8 GPUs each: time-slicing x4,
   MPS x4, MIG mixed A100 7x 1g.10gb per GPU, plain L40S) and gpu-share built in release.
2. Writes the annotated pods through the webhook once as a dry run (admission runs, nothing is
   stored) and derives the baseline's pods from them: the same pods as the webhook wrote them,
   minus gpu-share's annotations (so plain nvidia.com/* requests, the same tolerations and node
   affinity), for a second kube-scheduler from the same binary running the default profile.
3. gpu-share: with the gpu-share-scheduler stopped, creates the annotated pods through the
   webhook, starts kube-scheduler again with the shipped configuration and times the bindings.
4. Baseline: creates its pods and times their bindings the same way.
   Each half's pods are deleted before the next half; --baseline-first runs the baseline first
   (the order's own effect, measured).

With --deployments R, the pods are a Deployment's, as most pods are: R replicas to a
ReplicaSet (each of one class, drawn as the pods are), every pod owned by its ReplicaSet (a
controller owner reference, the ReplicaSet's labels and pod-template-hash), the ReplicaSets created
first in each half's namespace with kube-controller-manager stopped (so no controller adds or
removes a pod; kube-scheduler reads the ReplicaSets as it does a Deployment's, and its default
topology spread spreads their pods). The baseline's pods are owned the same way by ReplicaSets of
their own.

With --profile DIR, each half also takes, 30 s long once a tenth of its pods are bound: a CPU
profile of kube-scheduler (its /debug/pprof/profile), `perf record` of the extender (gpu-share's
half), and every control-plane process's CPU over the same 30 s (from /proc); DIR/summary.txt
keeps the top of each (go tool pprof -top, perf report) and kube-apiserver's requests and watch
events per bound pod over the same window (its /metrics), plus 30 s of the idle cluster.

Both profiles score every node (percentageOfNodesToScore: 100, as gpu-share's profile ships;
--nodes-to-score P sets both to P, 0 being kube-scheduler's adaptive default) and use the same
clientConnection qps/burst (500/1000; with the defaults, 50 QPS, the baseline's own binding calls
would be the bottleneck). Reported: pods bound per second for each and the ratio, kube-scheduler's
scheduler_scheduling_algorithm_duration_seconds (which includes the extender's filter and
prioritize calls) for each, the extender's own per-verb histograms, and the extender's RSS.
"""
import argparse
import collections
import concurrent.futures
import json
import os
import random
import re
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request

import yaml

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QPS, BURST = 500, 1000


def log(msg):
    print(f"cluster-scale [{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---- the cluster --------------------------------------------------------------------------------

def gpu_node(name, labels, alloc):
    lab = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "nvidia.com/gpu.present": "true",
           "nvidia.com/cuda.driver-version.full": "550.107.02"}
    lab.update(labels)
    res = {"cpu": "128", "memory": "1056964608Ki", "pods": "110"}
    res.update(alloc)
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": lab},
            "spec": {"taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]},
            "status": {"capacity": dict(res), "allocatable": dict(res)}}


def nodes(n):
    """60% time-slicing x4, 20% MPS x4, 10% MIG mixed (A100 80GB, 7x 1g.10gb per GPU), 10% plain."""
    out = []
    for i in range(n):
        kind = i % 10
        if kind < 6:
            out.append(gpu_node(f"ts-{i}", {
                "nvidia.com/gpu.product": "NVIDIA-L4-SHARED", "nvidia.com/gpu.count": "8",
                "nvidia.com/gpu.memory": "23034", "nvidia.com/gpu.replicas": "4",
                "nvidia.com/gpu.sharing-strategy": "time-slicing"}, {"nvidia.com/gpu": "32"}))
        elif kind < 8:
            out.append(gpu_node(f"mps-{i}", {
                "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3-SHARED", "nvidia.com/gpu.count": "8",
                "nvidia.com/gpu.memory": "81559", "nvidia.com/gpu.replicas": "4",
                "nvidia.com/gpu.sharing-strategy": "mps"}, {"nvidia.com/gpu": "32"}))
        elif kind < 9:
            out.append(gpu_node(f"mig-{i}", {
                "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", "nvidia.com/gpu.count": "8",
                "nvidia.com/gpu.memory": "81920", "nvidia.com/gpu.replicas": "1",
                "nvidia.com/gpu.sharing-strategy": "none", "nvidia.com/mig.capable": "true",
                "nvidia.com/mig.strategy": "mixed", "nvidia.com/mig.config": "all-1g.10gb",
                "nvidia.com/mig-1g.10gb.count": "56", "nvidia.com/mig-1g.10gb.memory": "9728"},
                {"nvidia.com/gpu": "0", "nvidia.com/mig-1g.10gb": "56"}))
        else:
            out.append(gpu_node(f"plain-{i}", {
                "nvidia.com/gpu.product": "NVIDIA-L40S", "nvidia.com/gpu.count": "8",
                "nvidia.com/gpu.memory": "46068", "nvidia.com/gpu.replicas": "1",
                "nvidia.com/gpu.sharing-strategy": "none"}, {"nvidia.com/gpu": "8"}))
    return out


def pod_mix(n, seed=42):
    """Classes in proportion to the capacity of each kind, well inside it (about 40%)."""
    rng = random.Random(seed)
    classes = (["timeslice-25"] * 30 + ["timeslice-50"] * 15 + ["mps-25"] * 20
               + ["mig-1g.10gb"] * 25 + ["exclusive-1"] * 10)
    return [rng.choice(classes) for _ in range(n)]


def replica_sets(pods, replicas, seed=42):
    """`pods` pods as Deployments' of `replicas` replicas: for each pod, its ReplicaSet's index;
    and each ReplicaSet's class, drawn as pod_mix draws a pod's."""
    count = (pods + replicas - 1) // replicas
    return [i // replicas for i in range(pods)], pod_mix(count, seed)


def replica_set(k, replicas, template_spec, annotations):
    """ReplicaSet k of a Deployment `d-k`, as the Deployment controller writes it: labelled and
    selected by app and pod-template-hash, of `replicas` pods."""
    labels = {"app": f"d-{k}", "pod-template-hash": f"{k:x}5c9d"}
    return {"apiVersion": "apps/v1", "kind": "ReplicaSet",
            "metadata": {"name": f"d-{k}-{labels['pod-template-hash']}", "labels": labels},
            "spec": {"replicas": replicas, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels, "annotations": annotations},
                                  "spec": template_spec}}}


def owned(body, rs):
    """`body`, a pod of ReplicaSet `rs` (as the API stored it): its labels and controller owner
    reference."""
    body["metadata"]["labels"] = dict(rs["metadata"]["labels"])
    body["metadata"]["ownerReferences"] = [{
        "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": rs["metadata"]["name"],
        "uid": rs["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}]
    return body


class Api:
    def __init__(self, directory):
        cfg = yaml.safe_load(open(f"{directory}/kubeconfig"))
        cluster, user = cfg["clusters"][0]["cluster"], cfg["users"][0]["user"]
        self.server = cluster["server"]
        self.ctx = ssl.create_default_context(cafile=cluster["certificate-authority"])
        self.ctx.load_cert_chain(user["client-certificate"], user["client-key"])

    def call(self, method, path, body=None, ctype="application/json", raw=False):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.server + path, data=data, method=method)
        req.add_header("Content-Type", ctype)
        for attempt in range(5):
            try:
                with urllib.request.urlopen(req, context=self.ctx, timeout=120) as resp:
                    payload = resp.read()
                    return payload.decode() if raw else json.loads(payload)
            except urllib.error.HTTPError as e:
                if e.code in (429, 500, 503, 504) and attempt < 4:
                    time.sleep(0.5 * (attempt + 1))
                    continue
                raise RuntimeError(f"{method} {path}: HTTP {e.code}: {e.read()[:300]!r}") from None
            except (ConnectionError, TimeoutError, urllib.error.URLError) as e:
                # A loaded API server may drop a long call (deleting 20,000 pods at once did, at
                # 5,000 nodes): reads, patches and deletes are tried again (a create is not).
                if attempt < 4 and method != "POST":
                    log(f"{method} {path}: {e}; trying again")
                    time.sleep(2 * (attempt + 1))
                    continue
                raise


def env_of(directory):
    return dict(l.split("=", 1) for l in open(f"{directory}/env").read().splitlines() if "=" in l)


def pid_of(directory, name):
    return int(open(f"{directory}/pids/{name}.pid").read().strip())


def stop(directory, name):
    try:
        pid = pid_of(directory, name)
    except FileNotFoundError:
        return
    subprocess.run(["kill", "-TERM", str(pid)], check=False)
    for _ in range(200):
        if subprocess.run(["kill", "-0", str(pid)], stderr=subprocess.DEVNULL).returncode != 0:
            break
        time.sleep(0.1)
    os.remove(f"{directory}/pids/{name}.pid")


def rss_mib(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


# ---- metrics ------------------------------------------------------------------------------------

def histogram(text, name, match=""):
    """Buckets (le -> count), sum and count of one Prometheus histogram (summed over series)."""
    buckets, total, count = {}, 0.0, 0.0
    for line in text.splitlines():
        if not line.startswith(name) or match not in line:
            continue
        m = re.match(rf'{name}_bucket{{.*le="([^"]+)".*}} ([0-9.e+]+)', line)
        if m:
            le = float("inf") if m.group(1) == "+Inf" else float(m.group(1))
            buckets[le] = buckets.get(le, 0.0) + float(m.group(2))
        elif line.startswith(f"{name}_sum"):
            total += float(line.rsplit(" ", 1)[1])
        elif line.startswith(f"{name}_count"):
            count += float(line.rsplit(" ", 1)[1])
    return buckets, total, count


def quantile(buckets, q):
    """The upper bound of the bucket that holds quantile q (Prometheus' bucket resolution)."""
    items = sorted(buckets.items())
    if not items:
        return float("nan")
    total = items[-1][1]
    for le, c in items:
        if c >= q * total:
            return le
    return float("inf")


def describe(buckets, total, count):
    if not count:
        return "no observations"
    return (f"mean {1000 * total / count:.2f} ms, p50 <= {1000 * quantile(buckets, 0.5):g} ms, "
            f"p99 <= {1000 * quantile(buckets, 0.99):g} ms ({int(count)} observations)")


def scheduler_metrics(directory, url):
    pki = f"{directory}/pki"
    out = subprocess.run(["curl", "-sf", "--cacert", "/dev/null", "-k", "--cert", f"{pki}/admin.crt",
                          "--key", f"{pki}/admin.key", f"{url}/metrics"], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"GET {url}/metrics failed: {out.stderr}")
    return out.stdout


# ---- the runs -----------------------------------------------------------------------------------

def create_all(api, namespace, bodies, workers=24, dry_run=False):
    start = time.time()
    path = f"/api/v1/namespaces/{namespace}/pods" + ("?dryRun=All" if dry_run else "")
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        results = list(pool.map(lambda b: api.call("POST", path, b), bodies))
    log(f"{'dry-run ' if dry_run else ''}created {len(bodies)} pods in {namespace} in {time.time() - start:.0f} s")
    return results


def scheduled_count(directory, url):
    """kube-scheduler's own count of pods it bound (schedule_attempts_total{result="scheduled"},
    counted after the binding call returns): polling it costs the apiserver nothing."""
    try:
        text = scheduler_metrics(directory, url)
    except RuntimeError:
        return 0
    return sum(float(l.rsplit(" ", 1)[1]) for l in text.splitlines()
               if l.startswith("scheduler_schedule_attempts_total{") and 'result="scheduled"' in l)


def cpu_ticks(directory):
    """Each control-plane process's CPU time so far (utime + stime, clock ticks), by name."""
    out = {}
    for f in os.listdir(f"{directory}/pids"):
        name = f[:-len(".pid")]
        try:
            pid = pid_of(directory, name)
            fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
            out[name] = int(fields[11]) + int(fields[12])
        except (OSError, ValueError, IndexError):
            continue
    return out


def take_profile(directory, url, half, out_dir, seconds=30, extender=True, scheduler_pid=None):
    """kube-scheduler's CPU profile, the extender's perf samples and every process's CPU share,
    over the same `seconds`, into out_dir/<half>-*; returns the CPU shares (cores, by process)."""
    os.makedirs(out_dir, exist_ok=True)
    pki = f"{directory}/pki"
    procs = [subprocess.Popen(["curl", "-sfk", "--cert", f"{pki}/admin.crt", "--key", f"{pki}/admin.key",
                               "-o", f"{out_dir}/{half}-kube-scheduler.pprof",
                               f"{url}/debug/pprof/profile?seconds={seconds}"])]
    if extender:
        procs.append(subprocess.Popen(["perf", "record", "-q", "-F", "199", "-p",
                                       str(pid_of(directory, "extender")), "-o",
                                       f"{out_dir}/{half}-extender.perf.data", "--", "sleep", str(seconds)],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    api_before = api_counters(directory)
    before, t0, bound0 = cpu_ticks(directory), time.time(), scheduled_count(directory, url)
    extra_before = None
    if scheduler_pid:
        extra_before = int(open(f"/proc/{scheduler_pid}/stat").read().rsplit(")", 1)[1].split()[11]) + \
            int(open(f"/proc/{scheduler_pid}/stat").read().rsplit(")", 1)[1].split()[12])
    for p in procs:
        p.wait(timeout=seconds + 60)
    after, dt, bound1 = cpu_ticks(directory), time.time() - t0, scheduled_count(directory, url)
    api_after = api_counters(directory)
    rate = (bound1 - bound0) / dt
    hz = os.sysconf("SC_CLK_TCK")
    shares = {k: (after[k] - before[k]) / hz / dt for k in after if k in before}
    if scheduler_pid:
        fields = open(f"/proc/{scheduler_pid}/stat").read().rsplit(")", 1)[1].split()
        shares["kube-scheduler (baseline)"] = (int(fields[11]) + int(fields[12]) - extra_before) / hz / dt
    with open(f"{out_dir}/summary.txt", "a") as f:
        f.write(f"== {half}: CPU over {dt:.0f} s, {rate:.1f} pods bound/s, cores (and CPU ms per bound pod): " +
                ", ".join(f"{k} {v:.2f} ({1000 * v / max(rate, 1e-9):.1f} ms)"
                          for k, v in sorted(shares.items(), key=lambda kv: -kv[1])) + "\n")
        top = subprocess.run(["go", "tool", "pprof", "-top", "-nodecount=45",
                              f"{out_dir}/{half}-kube-scheduler.pprof"], capture_output=True, text=True)
        f.write(f"== {half}: kube-scheduler, go tool pprof -top\n{top.stdout}{top.stderr[-500:]}\n")
        f.write(f"== {half}: kube-apiserver's work per bound pod over the same window\n"
                + api_per_pod(api_before, api_after, max(bound1 - bound0, 1)) + "\n")
        cum = subprocess.run(["go", "tool", "pprof", "-top", "-cum", "-nodecount=60",
                              f"{out_dir}/{half}-kube-scheduler.pprof"], capture_output=True, text=True)
        f.write(f"== {half}: kube-scheduler, go tool pprof -top -cum\n{cum.stdout}\n")
        if extender:
            metrics = urllib.request.urlopen(f"{env_of(directory)['EXTENDER_ADMIN']}/metrics").read().decode()
            conns = [l for l in metrics.splitlines() if l.startswith("gpu_share_connections")]
            f.write(f"== {half}: extender connections\n" + "\n".join(conns) + "\n")
            rep = subprocess.run(["perf", "report", "-i", f"{out_dir}/{half}-extender.perf.data", "--stdio",
                                  "--sort", "symbol", "--percent-limit", "0.7"],
                                 capture_output=True, text=True)
            f.write(f"== {half}: extender, perf report (self)\n{rep.stdout[-12000:]}\n")
    log(f"profiled {half}: " + ", ".join(f"{k} {v:.2f}" for k, v in sorted(shares.items(), key=lambda kv: -kv[1])))
    return shares


def api_counters(directory):
    """kube-apiserver's request counts (by verb, resource, subresource and client), and its watch
    events and their bytes (by kind), from its /metrics."""
    server = yaml.safe_load(open(f"{directory}/kubeconfig"))["clusters"][0]["cluster"]["server"]
    try:
        text = scheduler_metrics(directory, server)
    except RuntimeError:
        return {}
    out = {}
    for line in text.splitlines():
        if line.startswith("apiserver_request_total{"):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}", 1)[0]))
            key = ("request", labels.get("verb", ""), labels.get("resource", "") +
                   (f"/{labels['subresource']}" if labels.get("subresource") else ""))
        elif line.startswith(("apiserver_watch_events_total{", "apiserver_watch_events_sizes_sum{")):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}", 1)[0]))
            what = "watch events" if line.startswith("apiserver_watch_events_total") else "watch bytes"
            key = (what, "", labels.get("resource", labels.get("kind", "")))
        else:
            continue
        try:
            out[key] = out.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
        except ValueError:
            continue
    return out


def api_per_pod(before, after, bound):
    """The counters that moved between two api_counters readings, per bound pod, largest first."""
    moved = {k: after[k] - before.get(k, 0.0) for k in after}
    rows = [f"{kind:12} {verb:7} {res:32} {v / bound:10.2f}"
            for (kind, verb, res), v in sorted(moved.items(), key=lambda kv: -kv[1]) if v > 0]
    return "\n".join(rows[:40])


def keep_attempts(out_dir, half, text):
    """With --profile: kube-scheduler's attempts by result, its preemptions and its extender
    calls at the end of a half, into out_dir/summary.txt (a retry runs every filter again)."""
    if not out_dir:
        return
    keep = [l for l in text.splitlines() if l.startswith(("scheduler_schedule_attempts_total",
                                                          "scheduler_preemption_attempts_total",
                                                          "scheduler_preemption_victims_count",
                                                          "scheduler_unschedulable_pods"))]
    with open(f"{out_dir}/summary.txt", "a") as f:
        f.write(f"== {half}: kube-scheduler's attempts at the end\n" + "\n".join(keep) + "\n")


def wait_bound(api, directory, url, namespace, n, limit, profile=None):
    """Waits until kube-scheduler has bound n pods (or `limit` seconds pass without progress);
    returns the pods of the namespace bound in the API, and the times of the first and the last
    binding seen. `profile`: called once in a thread when a tenth of the pods are bound."""
    last_change, last = time.time(), 0
    first_seen = None
    profiler = None
    while True:
        bound = scheduled_count(directory, url)
        now = time.time()
        if profile and profiler is None and bound >= n / 10:
            profiler = concurrent.futures.ThreadPoolExecutor(max_workers=1)
            profiler.submit(profile)
        if bound and first_seen is None:
            first_seen = now
        if bound != last:
            last, last_change = bound, now
        if bound >= n or now - last_change > limit:
            break
        time.sleep(0.5)
    if profiler:
        profiler.shutdown(wait=True)
    items = api.call("GET", f"/api/v1/namespaces/{namespace}/pods?fieldSelector=spec.nodeName!%3D")["items"]
    return len(items), first_seen or now, last_change


def ensure_namespace(api, name):
    try:
        api.call("POST", "/api/v1/namespaces", {"metadata": {"name": name}})
    except RuntimeError as e:
        if "409" not in str(e):
            raise
    try:
        api.call("POST", f"/api/v1/namespaces/{name}/serviceaccounts", {"metadata": {"name": "default"}})
    except RuntimeError as e:
        if "409" not in str(e):
            raise


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--pods", type=int, default=20000)
    ap.add_argument("--out", default=os.path.join(REPO, "benches", "results", "cluster-scale.md"))
    ap.add_argument("--keep", action="store_true", help="leave the cluster running")
    ap.add_argument("--gpu-share-bin", help="a gpu-share binary to run (default: cargo build --release)")
    ap.add_argument("--profile", metavar="DIR", help="profile each half into DIR (see above)")
    ap.add_argument("--nodes-to-score", type=int, default=100, choices=range(0, 101), metavar="0-100",
                    help="percentageOfNodesToScore for both profiles (default 100; 0: adaptive)")
    ap.add_argument("--baseline-first", action="store_true",
                    help="run the default profile's half first (the order's effect, measured)")
    ap.add_argument("--deployments", type=int, default=0, metavar="R",
                    help="the pods are Deployments' of R replicas each, owned by their ReplicaSets (see above)")
    args = ap.parse_args()

    with_cluster(args, "scale", nodes(args.nodes), lambda directory: run(args, directory))


def with_cluster(args, name, node_items, work):
    """Builds gpu-share (unless --gpu-share-bin), starts tests/cluster/up.sh with `node_items`,
    runs work(directory) for the report, stops the cluster (unless --keep), and writes the report
    to --out and standard output."""
    binary = args.gpu_share_bin
    if not binary:
        log("cargo build --release --bin gpu-share")
        subprocess.run(["cargo", "build", "--release", "--locked", "--quiet", "--bin", "gpu-share"], cwd=REPO, check=True)
        binary = os.path.join(REPO, "target/release/gpu-share")
    directory = tempfile.mkdtemp(prefix=f"gpu-share-{name}-")
    node_file = os.path.join(directory, f"{name}-nodes.yaml")
    with open(node_file, "w") as f:
        yaml.safe_dump({"apiVersion": "v1", "kind": "NodeList", "items": node_items}, f)
    env = dict(os.environ, GPU_SHARE_BIN=os.path.abspath(binary),
               GPU_SHARE_CLUSTER_NODES=node_file)
    log(f"tests/cluster/up.sh {directory} with {len(node_items)} nodes")
    t = time.time()
    try:
        subprocess.run(["bash", os.path.join(REPO, "tests/cluster/up.sh"), directory], env=env, check=True,
                       stdout=subprocess.DEVNULL)
        log(f"cluster up in {time.time() - t:.0f} s")
        report = work(directory)
    finally:
        if not args.keep:
            subprocess.run(["bash", os.path.join(REPO, "tests/cluster/down.sh"), directory], check=False)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        f.write(report)
    print(report)


def run(args, directory):
    api = Api(directory)
    env = env_of(directory)
    bin_dir = env["CONTROL_PLANE_BIN"]
    classes = pod_mix(args.pods)

    # Same qps/burst for both profiles, written into a copy of the shipped config.
    cfg = yaml.safe_load(open(f"{directory}/scheduler-config.yaml"))
    cfg["clientConnection"].update({"qps": QPS, "burst": BURST})
    for profile in cfg["profiles"]:
        profile["percentageOfNodesToScore"] = args.nodes_to_score
    yaml.safe_dump(cfg, open(f"{directory}/scheduler-config.yaml", "w"), sort_keys=False)

    # ---- the quantity advertised on every GPU node (gpu-share.io/gpu-milli, docs/quotas.md) ----
    adv = advertisement(api, directory)
    log(f"advertised: {adv['advertising']} of {adv['nodes']} nodes, {adv['patched']} patches in "
        f"{adv['batches']} batches, {adv['span']:.1f} s from the first to the last")

    # ---- the cluster idle: what 5,000 nodes' heartbeats cost every process with no pod to place ----
    if args.profile:
        os.makedirs(args.profile, exist_ok=True)
        before, t0 = cpu_ticks(directory), time.time()
        time.sleep(30)
        after, dt = cpu_ticks(directory), time.time() - t0
        hz = os.sysconf("SC_CLK_TCK")
        idle = {k: (after[k] - before[k]) / hz / dt for k in after if k in before}
        with open(f"{args.profile}/summary.txt", "a") as f:
            f.write(f"== idle: CPU over {dt:.0f} s with no pod to place, cores: " +
                    ", ".join(f"{k} {v:.2f}" for k, v in sorted(idle.items(), key=lambda kv: -kv[1])) + "\n")

    pod_spec = {"terminationGracePeriodSeconds": 0,
                "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                                "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}}}]}
    owner_of, rs_classes = replica_sets(args.pods, args.deployments) if args.deployments else (None, [])
    if owner_of:
        classes = [rs_classes[k] for k in owner_of]
    bodies = [{"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": f"p-{i}", "annotations": {"gpu-share": c}},
               "spec": json.loads(json.dumps(pod_spec))}
              for i, c in enumerate(classes)]
    stop(directory, "kube-scheduler")
    if owner_of:
        # No controller adds or removes a pod of the ReplicaSets below.
        stop(directory, "kube-controller-manager")

    def make_replica_sets(namespace, template_spec, annotate):
        """The ReplicaSets of the pods in `namespace`, as the API stored them (with their UIDs);
        gpu-share's carry their class on the template, as a Deployment's would."""
        path = f"/apis/apps/v1/namespaces/{namespace}/replicasets"
        sizes = collections.Counter(owner_of)
        made = [api.call("POST", path, replica_set(k, sizes[k], template_spec,
                                                   {"gpu-share": c} if annotate else {}))
                for k, c in enumerate(rs_classes)]
        log(f"created {len(made)} ReplicaSets in {namespace}")
        return made
    ensure_namespace(api, "scale")
    ensure_namespace(api, "baseline")
    # The baseline's pods are the gpu-share pods as the webhook writes them (a dry-run create:
    # admission runs, nothing is stored), so either half can run first.
    if owner_of:
        scale_sets = make_replica_sets("scale", pod_spec, True)
        bodies = [owned(b, scale_sets[owner_of[i]]) for i, b in enumerate(bodies)]
    written = create_all(api, "scale", bodies, dry_run=True)
    plain = []
    for i, p in enumerate(written):
        spec = p["spec"]
        keep = {k: spec[k] for k in ("containers", "tolerations", "affinity", "terminationGracePeriodSeconds")
                if k in spec}
        for c in keep["containers"]:
            # gpu-share's env, and the token volume the ServiceAccount plugin adds again.
            c.pop("env", None)
            c.pop("volumeMounts", None)
            # gpu-share's quantity, which the default profile does not know to ignore.
            for part in ("limits", "requests"):
                c.get("resources", {}).get(part, {}).pop("gpu-share.io/gpu-milli", None)
        keep["schedulerName"] = "bench-default"
        plain.append({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"b-{i}"}, "spec": keep})
    if owner_of:
        # The baseline's own ReplicaSets, of the pods as the webhook wrote them.
        baseline_sets = make_replica_sets("baseline", plain[0]["spec"], False)
        plain = [owned(b, baseline_sets[owner_of[i]]) for i, b in enumerate(plain)]

    def delete_all(namespace):
        try:
            api.call("DELETE", f"/api/v1/namespaces/{namespace}/pods", {"gracePeriodSeconds": 0})
        except (RuntimeError, ConnectionError, TimeoutError, urllib.error.URLError) as e:
            # The measurements are taken; the cluster is stopped next anyway.
            log(f"could not delete the pods of {namespace} ({e}); the report stands")
        # The next half starts on empty nodes.
        deadline = time.time() + 600
        while time.time() < deadline:
            left = api.call("GET", f"/api/v1/namespaces/{namespace}/pods?limit=1")["items"]
            if not left:
                return
            time.sleep(2)

    def gpu_share_half():
        stored = create_all(api, "scale", bodies)
        subprocess.run(["bash", f"{directory}/start/kube-scheduler.sh"], check=True)
        profile = args.profile and (lambda: take_profile(directory, env["SCHEDULER"], "gpu-share", args.profile))
        bound, first, last = wait_bound(api, directory, env["SCHEDULER"], "scale", args.pods, limit=60,
                                        profile=profile)
        rate = (bound - 1) / max(last - first, 1e-9)
        log(f"gpu-share: {bound} bound, {rate:.1f} pods/s")
        sched = scheduler_metrics(directory, env["SCHEDULER"])
        keep_attempts(args.profile, "gpu-share", sched)
        ext = urllib.request.urlopen(f"{env['EXTENDER_ADMIN']}/metrics").read().decode()
        ledger = json.loads(urllib.request.urlopen(f"{env['EXTENDER_ADMIN']}/v1/nodes").read())
        out = {
            "bound": bound, "rate": rate,
            "algo": histogram(sched, "scheduler_scheduling_algorithm_duration_seconds"),
            "verbs": {v: histogram(ext, "gpu_share_request_duration_seconds", f'endpoint="{v}"')
                      for v in ("filter", "prioritize", "bind")},
            "rss": rss_mib(pid_of(directory, "extender")),
            "ledger_pods": sum(len(n.get("pods", [])) for n in ledger),
            "ledger_nodes": len(ledger),
            "size": len(json.dumps(stored[0])),
        }
        stop(directory, "kube-scheduler")
        delete_all("scale")
        return out

    def baseline_half():
        stored = create_all(api, "baseline", plain)
        port = env["SCHEDULER"].rsplit(":", 1)[1]
        log_path = f"{directory}/logs/baseline-scheduler.log"
        with open(log_path, "a") as logf:
            proc = subprocess.Popen([f"{bin_dir}/kube-scheduler", "--config", f"{directory}/baseline-config.yaml",
                                     "--bind-address", "127.0.0.1", "--secure-port", port,
                                     "--authentication-kubeconfig", f"{directory}/kubeconfig",
                                     "--authorization-kubeconfig", f"{directory}/kubeconfig", "--v", "1"],
                                    stdout=logf, stderr=logf, start_new_session=True)
        try:
            time.sleep(1)
            profile = args.profile and (lambda: take_profile(directory, env["SCHEDULER"], "baseline", args.profile,
                                                             extender=False, scheduler_pid=proc.pid))
            bound, first, last = wait_bound(api, directory, env["SCHEDULER"], "baseline", args.pods, limit=60,
                                            profile=profile)
            rate = (bound - 1) / max(last - first, 1e-9)
            log(f"baseline: {bound} bound, {rate:.1f} pods/s")
            sched = scheduler_metrics(directory, env["SCHEDULER"])
            keep_attempts(args.profile, "baseline", sched)
            algo = histogram(sched, "scheduler_scheduling_algorithm_duration_seconds")
        finally:
            proc.terminate()
            proc.wait(timeout=30)
        delete_all("baseline")
        return {"bound": bound, "rate": rate, "algo": algo, "size": len(json.dumps(stored[0]))}

    base_cfg = {
        "apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": f"{directory}/kubeconfig", "qps": QPS, "burst": BURST},
        "leaderElection": {"leaderElect": False},
        "profiles": [{"schedulerName": "bench-default", "percentageOfNodesToScore": args.nodes_to_score}],
    }
    yaml.safe_dump(base_cfg, open(f"{directory}/baseline-config.yaml", "w"))
    if args.baseline_first:
        b, g = baseline_half(), gpu_share_half()
    else:
        g, b = gpu_share_half(), baseline_half()
    bound, gs_rate, gs_algo, verbs = g["bound"], g["rate"], g["algo"], g["verbs"]
    b_bound, b_rate, b_algo = b["bound"], b["rate"], b["algo"]
    ext_rss, ledger_pods, ledger_nodes = g["rss"], g["ledger_pods"], g["ledger_nodes"]
    sizes = (g["size"], b["size"])

    scoring = ("Both profiles score every node (percentageOfNodesToScore 100)." if args.nodes_to_score == 100
               else f"Both profiles run percentageOfNodesToScore {args.nodes_to_score}"
               + (" (kube-scheduler's adaptive default)" if args.nodes_to_score == 0 else "") + ".")
    cpu = subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip()
    lines = [
        "# gpu-share at scale on a real control plane",
        "",
        "Written by `benches/cluster-scale.py`; the README keeps one line of it.",
        "",
        f"Command: `python3 benches/cluster-scale.py --nodes {args.nodes} --pods {args.pods}"
        f"{'' if args.nodes_to_score == 100 else f' --nodes-to-score {args.nodes_to_score}'}"
        f"{' --baseline-first' if args.baseline_first else ''}"
        f"{f' --deployments {args.deployments}' if args.deployments else ''}` "
        f"({time.strftime('%Y-%m-%d')}, {cpu} cores; kube-apiserver, etcd and kube-scheduler v1.37.2 "
        "from tests/cluster, everything on one machine).",
        "",
        f"{args.nodes} GPU nodes of 8 GPUs (60% time-slicing x4, 20% MPS x4, 10% MIG mixed A100 7x 1g.10gb "
        f"per GPU, 10% plain L40S); {args.pods} pods (timeslice-25 30%, mps-25 20%, mig-1g.10gb 25%, "
        "timeslice-50 15%, exclusive-1 10%)"
        + (f", as Deployments of {args.deployments} replicas, each pod owned by its ReplicaSet"
           f" ({len(rs_classes)} ReplicaSets per half, each of one class)" if args.deployments else ", bare")
        + ". " + scoring + " Both use clientConnection "
        f"qps {QPS} / burst {BURST}. The pods are created while the scheduler is stopped; the rate is "
        "bound pods over the time from the first binding to the last (kube-scheduler's "
        "schedule_attempts_total{result=\"scheduled\"}, polled every 0.5 s; the bound count is read from the "
        "API at the end).",
        "",
        "| | gpu-share-scheduler (extender) | default profile (same binary) |",
        "|---|---|---|",
        f"| pods bound | {bound} of {args.pods} | {b_bound} of {args.pods} |",
        f"| pods bound per second | {gs_rate:.1f} | {b_rate:.1f} |",
        f"| ratio gpu-share / default | {gs_rate / b_rate:.2f} | 1 |",
        f"| scheduler_scheduling_algorithm_duration_seconds | {describe(*gs_algo)} | {describe(*b_algo)} |",
        "",
        "The extender's own histograms (`gpu_share_request_duration_seconds`, server side):",
        "",
    ]
    for v, h in verbs.items():
        lines.append(f"- {v}: {describe(*h)}")
    lines += [
        "",
        f"Extender RSS after the gpu-share run: {ext_rss:.0f} MiB, its ledger holding "
        f"{ledger_pods} pods on {ledger_nodes} nodes.",
        "",
        f"Halves in order: {'baseline, then gpu-share' if args.baseline_first else 'gpu-share, then baseline'} "
        f"(each half's pods deleted before the next). The first pod as the API stored it "
        f"(JSON, before scheduling): {sizes[0]} bytes for gpu-share's, {sizes[1]} for the baseline's.",
        "",
        "The quantity (`gpu-share.io/gpu-milli`, on by default): every gpu-share pod above carries it "
        "(the baseline's pods do not), and the leading extender advertises it on every GPU node by a "
        f"node status patch. {adv['advertising']} of {adv['nodes']} nodes advertised it "
        f"({adv['patched']} patches, {adv['failed']} failed, in {adv['batches']} batches of at most 16 "
        f"in flight, {adv['patching']:.1f} s of patching in all; {adv['span']:.1f} s from the first "
        "batch's start to the last batch's end, "
        f"{adv['patched'] / max(adv['span'], 1e-9):.0f} nodes/s, while the cluster came up; read from "
        "the extender's log), and once each: "
        f"{adv['later']} patches in the {adv['after']:.0f} s that followed.",
        "",
    ]
    return "\n".join(lines)


def advertisement(api, directory):
    """Waits (up to 10 min) until every GPU node advertises gpu-share.io/gpu-milli, then reads the
    advertiser's batches from the extender's log: nodes patched, failures, batches, and the span
    from the first batch's start to the last one's end; then how many more patches came in the
    next 30 s (none: each node is patched once)."""
    deadline = time.time() + 600
    while True:
        items = api.call("GET", "/api/v1/nodes")["items"]
        gpu = [n for n in items if n["metadata"].get("labels", {}).get("nvidia.com/gpu.present") == "true"]
        have = [n for n in gpu if "gpu-share.io/gpu-milli" in n.get("status", {}).get("capacity", {})]
        if len(have) == len(gpu) or time.time() > deadline:
            break
        time.sleep(2)

    def batches():
        out = []
        for line in open(f"{directory}/logs/extender.log"):
            if "GPU nodes advertise gpu-share.io/gpu-milli" not in line:
                continue
            e = json.loads(line)
            end = time.mktime(time.strptime(e["timestamp"][:19], "%Y-%m-%dT%H:%M:%S")) + \
                float("0." + e["timestamp"][20:-1] if len(e["timestamp"]) > 20 else 0)
            out.append((end - e["seconds"], end, e["nodes"], e["failed"]))
        return out

    first = batches()
    after = 30
    time.sleep(after)
    later = sum(b[2] for b in batches()[len(first):])
    return {
        "nodes": len(gpu), "advertising": len(have), "batches": len(first),
        "patched": sum(b[2] for b in first), "failed": sum(b[3] for b in first),
        "patching": sum(b[1] - b[0] for b in first),
        "span": (max(b[1] for b in first) - min(b[0] for b in first)) if first else 0.0,
        "later": later, "after": after,
    }


if __name__ == "__main__":
    main()

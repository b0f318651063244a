#!/usr/bin/env python3
"""The extender's ledger rebuilt from a real API server holding a full cluster: list time and
build time apart, and the RSS after it.

    python3 benches/cluster-rebuild.py [--nodes 5000] [--pods 150000] [--out docs/cluster-rebuild.md]

1. Starts the control plane of tests/cluster/up.sh (kube-apiserver, etcd) with N GPU nodes of
   the mix of benches/cluster-scale.py (8 GPUs each: 60% time-slicing x4, 20% MPS x4, 10% MIG
   mixed A100 with 56 1g.10gb devices, 10% plain L40S) and gpu-share built in release.
2. Stops the extender and kube-scheduler. One pod of each class goes through the webhook; what
   it wrote is the template for every pod of that class. The webhook's configuration is removed
   while the pods are created already bound (spec.nodeName and the per-GPU annotation gpu-share's
   bind writes), as many as the nodes hold with quarter GPUs, MIG 1g devices and whole GPUs,
   then put back.
3. Starts the extender again (the shipped Deployment's arguments) and times it from start to
   ready. Its log says how long the pod list took and, apart, how long recording it in the
   ledger took. Reported with the RSS once ready and the ledger's own pod count.
"""
import argparse
import concurrent.futures
import http.client
import importlib.util
import json
import os
import subprocess
import threading
import time
import urllib.request


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
spec = importlib.util.spec_from_file_location("cluster_scale", os.path.join(REPO, "benches", "cluster-scale.py"))
scale = importlib.util.module_from_spec(spec)
spec.loader.exec_module(scale)
log = scale.log


def placements(node_items, limit):
    """(node, class, per-GPU annotation or None) for up to `limit` pods, filling each node kind
    with its smallest class: 4 quarter-GPU replicas per time-sliced or MPS GPU, 56 MIG 1g.10gb
    devices per MIG node, 8 whole GPUs per plain node. Whole GPUs and MIG go first (fewer of
    them), then MPS, then time-slicing, until `limit`."""
    by_kind = {"exclusive-1": [], "mig-1g.10gb": [], "mps-25": [], "timeslice-25": []}
    for n in node_items:
        name = n["metadata"]["name"]
        strategy = n["metadata"]["labels"].get("nvidia.com/gpu.sharing-strategy")
        if name.startswith("mig-"):
            by_kind["mig-1g.10gb"] += [(name, "mig-1g.10gb", None)] * 56
        elif strategy == "time-slicing":
            by_kind["timeslice-25"] += [(name, "timeslice-25", f"{g}:250") for g in range(8) for _ in range(4)]
        elif strategy == "mps":
            by_kind["mps-25"] += [(name, "mps-25", f"{g}:250") for g in range(8) for _ in range(4)]
        else:
            by_kind["exclusive-1"] += [(name, "exclusive-1", f"{g}:1000") for g in range(8)]
    out = []
    for cls in ("exclusive-1", "mig-1g.10gb", "mps-25", "timeslice-25"):
        out += by_kind[cls][: max(0, limit - len(out))]
    return out


class Conn(threading.local):
    """One kept-alive HTTPS connection to the API server per thread."""

    def __init__(self, api):
        self.api = api
        self.c = None

    def post(self, path, body):
        data = json.dumps(body).encode()
        for attempt in range(6):
            try:
                if self.c is None:
                    host = self.api.server.split("//", 1)[1]
                    self.c = http.client.HTTPSConnection(host, context=self.api.ctx, timeout=60)
                self.c.request("POST", path, data, {"Content-Type": "application/json"})
                r = self.c.getresponse()
                payload = r.read()
                if r.status in (200, 201, 409):
                    return r.status
                if r.status in (429, 500, 503, 504) and attempt < 5:
                    time.sleep(0.2 * (attempt + 1))
                    continue
                raise RuntimeError(f"POST {path}: HTTP {r.status}: {payload[:300]!r}")
            except (http.client.HTTPException, OSError):
                self.c = None
                if attempt == 5:
                    raise
                time.sleep(0.2 * (attempt + 1))


def kubectl(env, directory, *args, stdin=None):
    out = subprocess.run([f"{env['CONTROL_PLANE_BIN']}/kubectl", "--kubeconfig", f"{directory}/kubeconfig", *args],
                         input=stdin, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(args)}: {out.stderr}")
    return out.stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--pods", type=int, default=150000)
    ap.add_argument("--out", default=os.path.join(REPO, "docs", "cluster-rebuild.md"))
    ap.add_argument("--keep", action="store_true", help="leave the cluster running")
    ap.add_argument("--gpu-share-bin", help="a gpu-share binary to run (default: cargo build --release)")
    args = ap.parse_args()

    node_items = scale.nodes(args.nodes)
    scale.with_cluster(args, "rebuild", node_items, lambda directory: run(args, directory, node_items))


def run(args, directory, node_items):
    api = scale.Api(directory)
    env = scale.env_of(directory)
    scale.stop(directory, "kube-scheduler")
    scale.stop(directory, "extender")
    scale.ensure_namespace(api, "rebuild")

    # What the webhook writes for each class.
    templates = {}
    for cls in ("timeslice-25", "mps-25", "mig-1g.10gb", "exclusive-1"):
        name = f"template-{cls.replace('.', '-')}"
        p = api.call("POST", "/api/v1/namespaces/rebuild/pods", {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "annotations": {"gpu-share": cls}},
            "spec": {"terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                                     "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}}}]}})
        spec = {k: v for k, v in p["spec"].items()
                if k in ("containers", "tolerations", "affinity", "runtimeClassName", "hostIPC",
                         "schedulerName", "terminationGracePeriodSeconds", "priority")}
        for c in spec["containers"]:
            c.pop("volumeMounts", None)
        templates[cls] = ({k: v for k, v in p["metadata"]["annotations"].items()}, spec)
        api.call("DELETE", f"/api/v1/namespaces/rebuild/pods/{name}", {"gracePeriodSeconds": 0})

    plan = placements(node_items, args.pods)
    webhook = kubectl(env, directory, "get", "mutatingwebhookconfiguration", "gpu-share", "-o", "json")
    kubectl(env, directory, "delete", "mutatingwebhookconfiguration", "gpu-share")
    log(f"creating {len(plan)} bound pods (the webhook's configuration is removed meanwhile)")
    conn = Conn(api)

    def create(i):
        node, cls, gpus = plan[i]
        annotations, spec = templates[cls]
        annotations = dict(annotations)
        if gpus:
            annotations["gpu-share.io/gpus"] = gpus
        return conn.post("/api/v1/namespaces/rebuild/pods", {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"p-{i:06d}", "annotations": annotations},
            "spec": dict(spec, nodeName=node)})

    start = time.time()
    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=16) as pool:
            for done, _ in enumerate(pool.map(create, range(len(plan))), 1):
                if done % 25000 == 0:
                    log(f"  {done} created, {done / (time.time() - start):.0f}/s")
    finally:
        restored = json.loads(webhook)
        for k in ("resourceVersion", "uid", "creationTimestamp", "generation", "managedFields"):
            restored["metadata"].pop(k, None)
        kubectl(env, directory, "create", "-f", "-", stdin=json.dumps(restored))
    created_s = time.time() - start
    log(f"created {len(plan)} pods in {created_s:.0f} s")

    # The extender, cold.
    logfile = f"{directory}/logs/extender.log"
    offset = os.path.getsize(logfile) if os.path.exists(logfile) else 0
    t0 = time.time()
    subprocess.run(["bash", f"{directory}/start/extender.sh"], check=True)
    while True:
        try:
            urllib.request.urlopen(f"{env['EXTENDER_ADMIN']}/readyz", timeout=2).read()
            break
        except Exception:
            if time.time() - t0 > 600:
                raise RuntimeError("the extender was not ready within 600 s")
            time.sleep(0.05)
    ready_s = time.time() - t0
    pid = scale.pid_of(directory, "extender")
    time.sleep(1)
    rss_ready = scale.rss_mib(pid)
    with open(logfile) as f:
        f.seek(offset)
        lines = [json.loads(l) for l in f if l.startswith("{")]
    listed = {l.get("what"): l for l in lines if l.get("message") == "listed and recorded"}
    pods, nodes = listed.get("pods"), listed.get("nodes")
    if not pods or not nodes:
        raise RuntimeError(f"the extender's log has no 'listed and recorded' lines: {lines[-5:]}")
    ledger_pods = pods["ledger_pods"]
    # The first reconcile (every 60 s) lists everything again, a page at a time.
    deadline = time.time() + 150
    while time.time() < deadline:
        time.sleep(5)
        with open(logfile) as f:
            f.seek(offset)
            if any("reconcile" in l for l in f):
                break
    rss_later = scale.rss_mib(pid)
    time.sleep(60)
    rss_settled = scale.rss_mib(pid)
    with open(logfile) as f:
        f.seek(offset)
        reconciled = [json.loads(l) for l in f if l.startswith("{") and "reconcile" in l]

    classes = {}
    for _, cls, _ in plan:
        classes[cls] = classes.get(cls, 0) + 1
    mix = ", ".join(f"{cls} {n}" for cls, n in sorted(classes.items()))
    cpu = subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip()
    lines = [
        "# The ledger rebuilt from a real API server",
        "",
        "Written by `benches/cluster-rebuild.py`; the README keeps one line of it.",
        "",
        f"Command: `python3 benches/cluster-rebuild.py --nodes {args.nodes} --pods {args.pods}` "
        f"({time.strftime('%Y-%m-%d')}, {cpu} cores; kube-apiserver and etcd v1.37.2 from tests/cluster, "
        "on the same machine as the extender).",
        "",
        f"{args.nodes} GPU nodes of 8 GPUs (60% time-slicing x4, 20% MPS x4, 10% MIG mixed A100 with 56 1g.10gb "
        f"devices, 10% plain L40S) and {len(plan)} bound pods ({mix}), shaped as the webhook and the bind "
        f"write them (created in {created_s:.0f} s). The extender starts cold with the shipped Deployment's "
        "arguments; it lists nodes and pods (pages of 500, a consistent read) and records each as it arrives.",
        "",
        "| | |",
        "|---|---|",
        f"| pods listed | {pods['listed']} |",
        f"| pods in the ledger | {ledger_pods} |",
        f"| pod list, the API's time (pages of 500) | {float(pods['list_seconds']):.2f} s |",
        f"| recording the pods in the ledger | {float(pods['build_seconds']):.2f} s |",
        f"| node list / recording | {float(nodes['list_seconds']):.2f} s / {float(nodes['build_seconds']):.2f} s "
        f"({nodes['listed']} nodes) |",
        f"| extender start to ready | {ready_s:.1f} s |",
        f"| RSS once ready | {rss_ready:.0f} MiB |",
        f"| RSS after the first reconcile (a second list of everything, a page at a time) | {rss_later:.0f} MiB |",
        f"| RSS a minute after that | {rss_settled:.0f} MiB |",
        f"| the reconcile found | {reconciled[-1]['message'] if reconciled else 'nothing logged'} |",
        "",
        "The build time is the time spent recording listed pods, measured around each one in the watch "
        "loop; the list time is the rest of the time from the list's start to its end (the API server "
        "and etcd reading, encoding and sending the pages, and decoding them).",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()

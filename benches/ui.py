#!/usr/bin/env python3
"""First paint of the occupancy page for a 5,000-node cluster, in headless Chromium.

    cargo build --release && (cd tests/ui && npm ci) && python3 benches/ui.py [--nodes 5000] [--pods 20000]

Writes a NodeList of N GPU nodes (the example cluster's four kinds, tests/fixtures/extender/
nodes.yaml, copied round-robin under new names), starts the release build with
`serve --dev --nodes`, places the pods through the extender (filter, then bind; each filter names
one node, the next in turn, so placing them is quick), then loads the page five times in a fresh
browser context (tests/ui/paint.mjs) and prints the first contentful paint and DOMContentLoaded of
each load (ms since navigation start, which includes the server's render), with the median.
The budget (issue 32): the first paint within 1 s on this machine.
"""
import argparse
import http.client
import json
import os
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def nodes_file(n, path):
    """N copies of the example's GPU nodes, named kind-index."""
    import re
    text = open(os.path.join(ROOT, "tests/fixtures/extender/nodes.yaml")).read()
    items = text.split("\n  - apiVersion: v1\n")
    head, nodes = items[0], items[1:]
    gpu = [x for x in nodes if "nvidia.com/gpu.present" in x]
    out = ["apiVersion: v1", "kind: NodeList", "items:"]
    names = []
    for i in range(n):
        tmpl = gpu[i % len(gpu)]
        old = re.search(r"name: (\S+)", tmpl).group(1)
        new = f"{old}-{i:05d}"
        names.append((new, old))
        out.append("  - apiVersion: v1\n" + tmpl.replace(old, new).rstrip("\n"))
    open(path, "w").write("\n".join(out) + "\n")
    return names


REQUESTS = {
    "a100-mig": ["mig-1g.10gb", "mig-3g.40gb", "mig-1g.10gb", "exclusive"],
    "h100-ts": ["timeslice-25", "timeslice-50", "timeslice-10"],
    "h100-mps": ["mps-25", "mps-25"],
    "l40s-plain": ["exclusive", "exclusive-2"],
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--pods", type=int, default=20000)
    ap.add_argument("--loads", type=int, default=5)
    args = ap.parse_args()
    binary = os.path.join(ROOT, "target/release/gpu-share")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "nodes.yaml")
        names = nodes_file(args.nodes, path)
        https, admin = free_port(), free_port()
        log = open(os.path.join(tmp, "serve.log"), "w")
        server = subprocess.Popen([binary, "serve", "--dev", "--nodes", path,
                                   "--listen", f"127.0.0.1:{https}", "--admin-listen", f"127.0.0.1:{admin}"],
                                  stdout=subprocess.DEVNULL, stderr=log)
        try:
            for _ in range(600):
                try:
                    c = http.client.HTTPConnection("127.0.0.1", admin, timeout=2)
                    c.request("GET", "/readyz")
                    if c.getresponse().status == 200:
                        break
                except OSError:
                    pass
                time.sleep(0.1)
            conn = http.client.HTTPSConnection("127.0.0.1", https, context=ssl._create_unverified_context())

            def post(path, body):
                conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
                return json.loads(conn.getresponse().read())

            start, placed = time.time(), 0
            for i in range(args.pods):
                node, kind = names[i % len(names)]
                reqs = REQUESTS[kind]
                req = reqs[(i // len(names)) % len(reqs)]
                uid = f"uid-{i}"
                pod = {"metadata": {"name": f"p-{i}", "namespace": f"ns-{i % 40}", "uid": uid,
                                    "annotations": {"gpu-share": req, "gpu-share.io/request": req}},
                       "spec": {"containers": [{"name": "c"}]}}
                if post("/scheduler/filter", {"Pod": pod, "NodeNames": [node]}).get("NodeNames"):
                    post("/scheduler/bind", {"PodName": f"p-{i}", "PodNamespace": pod["metadata"]["namespace"],
                                             "PodUID": uid, "Node": node})
                    placed += 1
            print(f"{args.nodes} nodes, {placed} of {args.pods} pods placed in {time.time() - start:.0f} s")
            out = subprocess.run(["node", os.path.join(ROOT, "tests/ui/paint.mjs"),
                                  f"http://127.0.0.1:{admin}/", str(args.loads)],
                                 capture_output=True, text=True, check=True)
            loads = json.loads(out.stdout)
            for k, l in enumerate(loads, 1):
                print(f"load {k}: first contentful paint {l['fcp_ms']:.0f} ms, DOMContentLoaded "
                      f"{l['dom_content_loaded_ms']:.0f} ms, response {l['response_end_ms']:.0f} ms, "
                      f"{l['bytes'] / 1024:.0f} KiB, {l['nodes']} nodes drawn")
            fcp = [l["fcp_ms"] for l in loads]
            print(f"first contentful paint: median {statistics.median(fcp):.0f} ms "
                  f"(range {min(fcp):.0f}-{max(fcp):.0f}) over {len(fcp)} loads; budget 1000 ms")
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=30)


if __name__ == "__main__":
    sys.exit(main())

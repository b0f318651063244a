#!/usr/bin/env python3
"""Registers Node objects as a kubelet would, in the cluster tests/cluster/up.sh started.

Usage: nodes.py DIR FILE [NAME...]
  FILE: a NodeList, a List or a YAML stream of Nodes, with labels and status.capacity /
  allocatable as the device plugin advertises them; NAMEs: register only these nodes of FILE.

For each node: create it (the apiserver's TaintNodesByCondition plugin adds the
node.kubernetes.io/not-ready taint to a new node), write its status with a Ready condition, and
remove that taint at once rather than wait for kube-controller-manager's node-lifecycle
controller. Then wait until kube-controller-manager has written each new node once (its TTL
annotation, node.alpha.kubernetes.io/ttl, and the beta OS and arch labels), so that the nodes
no longer change when a test starts: a node update requeues every pod an extender refused. KWOK
keeps them Ready afterwards. The admin client certificate of DIR/kubeconfig is used. Creates run
on a pool of threads, so 5,000 nodes take seconds, not minutes.
"""
import concurrent.futures
import datetime
import json
import ssl
import sys
import time
import urllib.request

import yaml

NOT_READY = "node.kubernetes.io/not-ready"
TTL = "node.alpha.kubernetes.io/ttl"
SETTLE_SECONDS = 60


def load_nodes(path):
    nodes = []
    for doc in yaml.safe_load_all(open(path)):
        if not doc:
            continue
        if doc.get("kind") in ("NodeList", "List"):
            nodes.extend(doc.get("items") or [])
        else:
            nodes.append(doc)
    for n in nodes:
        if n.get("kind", "Node") != "Node":
            raise SystemExit(f"{path}: not a Node: {n.get('kind')}")
    return nodes


class Api:
    def __init__(self, kubeconfig):
        cfg = yaml.safe_load(open(kubeconfig))
        cluster = cfg["clusters"][0]["cluster"]
        user = cfg["users"][0]["user"]
        self.server = cluster["server"]
        ctx = ssl.create_default_context(cafile=cluster["certificate-authority"])
        ctx.load_cert_chain(user["client-certificate"], user["client-key"])
        self.ctx = ctx

    def call(self, method, path, body=None, content_type="application/json"):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.server + path, data=data, method=method)
        req.add_header("Content-Type", content_type)
        req.add_header("Accept", "application/json")
        try:
            with urllib.request.urlopen(req, context=self.ctx, timeout=30) as resp:
                return json.load(resp)
        except urllib.error.HTTPError as e:
            raise RuntimeError(f"{method} {path}: HTTP {e.code}: {e.read().decode(errors='replace')}") from None


def register(api, node):
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    name = node["metadata"]["name"]
    status = dict(node.get("status") or {})
    status["conditions"] = [
        {"type": "Ready", "status": "True", "reason": "KubeletReady",
         "message": "registered by tests/cluster/nodes.py", "lastHeartbeatTime": now, "lastTransitionTime": now},
    ]
    status.setdefault("nodeInfo", {"architecture": "amd64", "operatingSystem": "linux", "kubeletVersion": "v1.37.2"})
    body = {"apiVersion": "v1", "kind": "Node", "metadata": node["metadata"], "spec": node.get("spec") or {},
            "status": status}
    try:
        api.call("POST", "/api/v1/nodes", body)
    except RuntimeError as e:
        if "HTTP 409" not in str(e):  # already registered: write its status again
            raise
    api.call("PATCH", f"/api/v1/nodes/{name}/status", {"status": status}, "application/merge-patch+json")
    got = api.call("GET", f"/api/v1/nodes/{name}")
    taints = got.get("spec", {}).get("taints") or []
    kept = [t for t in taints if t.get("key") != NOT_READY]
    if len(kept) != len(taints):
        api.call("PATCH", f"/api/v1/nodes/{name}", {"spec": {"taints": kept or None}},
                 "application/merge-patch+json")
    return name


def main():
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    directory, path, names = sys.argv[1], sys.argv[2], set(sys.argv[3:])
    api = Api(f"{directory}/kubeconfig")
    nodes = load_nodes(path)
    if names:
        nodes = [n for n in nodes if n["metadata"]["name"] in names]
        missing = names - {n["metadata"]["name"] for n in nodes}
        if missing:
            raise SystemExit(f"{path}: no node named {', '.join(sorted(missing))}")
    with concurrent.futures.ThreadPoolExecutor(max_workers=16) as pool:
        for _ in pool.map(lambda n: register(api, n), nodes):
            pass
    wanted = {n["metadata"]["name"] for n in nodes}
    # kube-controller-manager writes a few dozen nodes a second on 2 cores: a minute, or more
    # for thousands (benches/cluster-scale.py registers 5,000).
    settle = max(SETTLE_SECONDS, len(nodes) // 20)
    deadline = time.monotonic() + settle
    while wanted:
        listed = api.call("GET", "/api/v1/nodes")["items"]
        wanted -= {n["metadata"]["name"] for n in listed if TTL in (n["metadata"].get("annotations") or {})}
        if not wanted:
            break
        if time.monotonic() > deadline:
            raise SystemExit(f"nodes.py: kube-controller-manager did not annotate {sorted(wanted)[:5]} within {settle} s")
        time.sleep(0.3)
    print(f"nodes.py: registered {len(nodes)} node(s) from {path}", file=sys.stderr)


if __name__ == "__main__":
    main()

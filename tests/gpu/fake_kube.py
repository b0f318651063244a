#!/usr/bin/env python3
"""A tiny fake Kubernetes API server (plain HTTP, 127.0.0.1) for `gpu-share reserve`.

Answers what the agent's kube client asks:
  GET/PATCH /api/v1/namespaces/<ns>/pods/<name>   -> a Pod (merge patch applied, RFC 7386)
  POST .../events (core v1 or events.k8s.io/v1)    -> 201 with the posted body
  PATCH .../events/<name>                          -> 200 with the body merged
  anything else                                    -> 404 Status
Every request (method, path, headers of interest, body) is appended as one JSON line to the
request log. Usable as a module (start_server) or standalone (prints the port, or writes it
to --port-file).
"""

import argparse
import json
import re
import sys
import threading
import time
import uuid as uuidlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

POD_RE = re.compile(r"^/api/v1/namespaces/([^/]+)/pods/([^/?]+)$")
EVENTS_RE = re.compile(
    r"^/(?:api/v1|apis/events\.k8s\.io/v1)/namespaces/([^/]+)/events(?:/([^/?]+))?$"
)


def merge_patch(target, patch):
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return patch
    if not isinstance(target, dict):
        target = {}
    out = dict(target)
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


def now_rfc3339():
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class State:
    def __init__(self, log_path):
        self.lock = threading.Lock()
        self.pods = {}
        self.events = {}
        self.requests = []
        self.rv = 100
        self.log_path = log_path

    def next_rv(self):
        self.rv += 1
        return str(self.rv)

    def record(self, entry):
        with self.lock:
            self.requests.append(entry)
            if self.log_path:
                with open(self.log_path, "a") as f:
                    f.write(json.dumps(entry) + "\n")

    def pod(self, ns, name):
        key = (ns, name)
        if key not in self.pods:
            self.pods[key] = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": name,
                    "namespace": ns,
                    "uid": str(uuidlib.uuid4()),
                    "resourceVersion": self.next_rv(),
                    "creationTimestamp": now_rfc3339(),
                    "labels": {
                        "app.kubernetes.io/name": "gpu-share",
                        "app.kubernetes.io/component": "reservation",
                    },
                    "annotations": {"gpu-share.io/reserve-gpu": "0"},
                },
                "spec": {
                    "nodeName": "fake-node",
                    "restartPolicy": "Never",
                    "containers": [{"name": "reserve", "image": "gpu-share:test", "args": ["reserve"]}],
                },
                "status": {"phase": "Running"},
            }
        return self.pods[key]


def make_handler(state):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "fake-kube/0.1"

        def log_message(self, fmt, *args):  # quiet: the JSON log is the record
            pass

        def _body(self):
            n = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(n) if n > 0 else b""
            try:
                return raw.decode("utf-8", "replace"), (json.loads(raw) if raw else None)
            except ValueError:
                return raw.decode("utf-8", "replace"), None

        def _send(self, code, obj):
            data = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _status(self, code, reason, message):
            return {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Failure",
                "message": message,
                "reason": reason,
                "code": code,
            }

        def _handle(self):
            raw, body = self._body()
            path = self.path.split("?", 1)[0]
            entry = {
                "t": round(time.time(), 3),
                "method": self.command,
                "path": self.path,
                "content_type": self.headers.get("Content-Type"),
                "user_agent": self.headers.get("User-Agent"),
                "body": body if body is not None else raw,
            }
            code, resp = 404, None
            with state.lock:
                m = POD_RE.match(path)
                e = EVENTS_RE.match(path)
                if m and self.command == "GET":
                    code, resp = 200, state.pod(*m.groups())
                elif m and self.command == "PATCH":
                    if not isinstance(body, dict):
                        code, resp = 400, self._status(400, "BadRequest", "patch body is not a JSON object")
                    else:
                        pod = state.pod(*m.groups())
                        keep = {k: pod["metadata"][k] for k in ("name", "namespace", "uid")}
                        pod = merge_patch(pod, body)
                        pod["metadata"].update(keep)
                        pod["metadata"]["resourceVersion"] = state.next_rv()
                        state.pods[m.groups()] = pod
                        code, resp = 200, pod
                elif e and self.command == "POST" and e.group(2) is None:
                    if not isinstance(body, dict):
                        code, resp = 400, self._status(400, "BadRequest", "event body is not a JSON object")
                    else:
                        ev = dict(body)
                        md = dict(ev.get("metadata") or {})
                        md.setdefault("namespace", e.group(1))
                        if not md.get("name"):
                            md["name"] = (md.get("generateName") or "event.") + uuidlib.uuid4().hex[:10]
                        md["uid"] = str(uuidlib.uuid4())
                        md["resourceVersion"] = state.next_rv()
                        md.setdefault("creationTimestamp", now_rfc3339())
                        ev["metadata"] = md
                        state.events[(e.group(1), md["name"])] = ev
                        code, resp = 201, ev
                elif e and self.command == "PATCH" and e.group(2):
                    key = (e.group(1), e.group(2))
                    if key in state.events and isinstance(body, dict):
                        state.events[key] = merge_patch(state.events[key], body)
                        code, resp = 200, state.events[key]
                    else:
                        code, resp = 404, self._status(404, "NotFound", f"events \"{e.group(2)}\" not found")
            if resp is None:
                resp = self._status(404, "NotFound", f"the server could not find the requested resource ({self.command} {path})")
            entry["status"] = code
            state.record(entry)
            self._send(code, resp)

        do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = _handle

    return Handler


def start_server(log_path=None, host="127.0.0.1", port=0):
    """Starts the server in a daemon thread; returns (server, state, port)."""
    state = State(log_path)
    srv = ThreadingHTTPServer((host, port), make_handler(state))
    srv.daemon_threads = True
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    return srv, state, srv.server_address[1]


def kubeconfig(port, namespace="default"):
    return f"""apiVersion: v1
kind: Config
clusters:
- name: fake
  cluster:
    server: http://127.0.0.1:{port}
contexts:
- name: fake
  context:
    cluster: fake
    user: fake
    namespace: {namespace}
current-context: fake
users:
- name: fake
  user: {{}}
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--log", default=None)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--port-file", default=None)
    ap.add_argument("--kubeconfig", default=None, help="write a kubeconfig pointing here")
    a = ap.parse_args()
    srv, _, port = start_server(a.log, port=a.port)
    if a.kubeconfig:
        with open(a.kubeconfig, "w") as f:
            f.write(kubeconfig(port))
    if a.port_file:
        with open(a.port_file, "w") as f:
            f.write(str(port))
    print(f"fake kube API on http://127.0.0.1:{port}", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        srv.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())

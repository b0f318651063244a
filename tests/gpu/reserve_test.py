#!/usr/bin/env python3
"""Part B: `gpu-share reserve` against a fake Kubernetes API server (fake_kube.py).

Cases (each a separate agent process and pod name, one shared fake server):
  real        the driver's NVML: expect the UUID PATCHed, the agent holding until SIGTERM, exit 0
  absent-lib  --nvml-library libnvidia-ml-absent.so.1: expect the failure path (error annotation,
              Event, termination log, exit 1)
  standin-uuid   (--local STANDIN_LIB) the stand-in libnvidia-ml.so.1 of tests/node/standin/nvml
                 (built with its build.sh) seeing one GPU GPU-12345678-...: as `real`
  standin-empty  (--local STANDIN_LIB) the stand-in seeing no GPU: failure path ("sees 0 GPUs")
Then the real case's UUID is compared with nvidia-smi's and pynvml's.
Writes a JSON summary (--json-out); prints everything.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fake_kube  # noqa: E402

FAKE_UUID = "GPU-12345678-1234-1234-1234-123456789abc"
NS = "gpu-share-reservations"
ANN_UUID = "gpu-share.io/gpu-uuid"
ANN_ERR = "gpu-share.io/reserve-error"


def log(*a):
    print(*a, flush=True)


def run_cmd(argv, timeout=20):
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        return p.returncode, p.stdout.strip(), p.stderr.strip()
    except FileNotFoundError as e:
        return None, "", f"not found: {e}"
    except subprocess.TimeoutExpired:
        return None, "", f"timed out after {timeout}s"


def pod_requests(state, pod):
    out = []
    for r in list(state.requests):
        path = r["path"].split("?", 1)[0]
        body = r.get("body")
        if path.endswith(f"/pods/{pod}"):
            out.append(r)
        elif "/events" in path and isinstance(body, dict):
            reg = body.get("regarding") or body.get("involvedObject") or {}
            if reg.get("name") == pod:
                out.append(r)
    return out


def patched_annotations(reqs):
    anns = []
    for r in reqs:
        if r["method"] == "PATCH" and "/pods/" in r["path"] and isinstance(r.get("body"), dict):
            anns.append(((r["body"].get("metadata") or {}).get("annotations")) or {})
    return anns


def standin_env(work, name, uuid):
    """The stand-in NVML's view for a case: a device directory (nvidiactl, and nvidia0 when
    `uuid` is given) and the marker naming the GPU."""
    dev = os.path.join(work, f"dev-{name}")
    os.makedirs(dev, exist_ok=True)
    nodes = ["nvidiactl"] + (["nvidia0"] if uuid else [])
    for n in nodes:
        open(os.path.join(dev, n), "w").close()
    env = {"GPU_SHARE_STANDIN_DEV_DIR": dev}
    if uuid:
        env["GPU_SHARE_STANDIN_GPU_0"] = uuid
    return env


def run_case(name, binary, work, port, state, extra_env, nvml_library, wait_s, expect_hold):
    pod = f"reserve-{name}"
    tl = os.path.join(work, f"termination-{name}.log")
    agent_log = os.path.join(work, f"agent-{name}.log")
    env = dict(os.environ)
    for k in list(env):
        if k.upper() in ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT", "HTTP_PROXY",
                         "HTTPS_PROXY", "ALL_PROXY") or k.startswith("GPU_SHARE_"):
            env.pop(k)
    env.update({
        "KUBECONFIG": os.path.join(work, "kubeconfig"),
        "HOME": work,
        "POD_NAME": pod,
        "POD_NAMESPACE": NS,
        "RUST_LOG": "info",
        "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost",
    })
    env.update(extra_env)
    argv = [binary, "reserve", "--termination-log", tl]
    if nvml_library:
        argv += ["--nvml-library", nvml_library]
    log(f"--- case {name}: {' '.join(argv)}  (POD_NAME={pod}, {extra_env or 'no stand-in'})")
    res = {"case": name, "pod": pod, "argv": argv, "env": extra_env, "expect_hold": expect_hold}
    t0 = time.time()
    with open(agent_log, "w") as lf:
        try:
            p = subprocess.Popen(argv, env=env, stdout=lf, stderr=subprocess.STDOUT,
                                 start_new_session=True)
        except OSError as e:
            res.update(ok=False, error=f"cannot start the binary: {e}")
            log(f"    cannot start: {e}")
            return res
    seen_uuid = None
    seen_err = None
    while time.time() - t0 < wait_s:
        anns = patched_annotations(pod_requests(state, pod))
        for a in anns:
            if a.get(ANN_UUID):
                seen_uuid = a[ANN_UUID]
            if a.get(ANN_ERR):
                seen_err = a[ANN_ERR]
        if seen_uuid or p.poll() is not None:
            break
        time.sleep(0.1)
    res["t_until_patch_or_exit_s"] = round(time.time() - t0, 3)
    # Give a failing agent a moment to post its Event and exit.
    if not seen_uuid:
        try:
            p.wait(timeout=max(1.0, min(15.0, wait_s - (time.time() - t0))))
        except subprocess.TimeoutExpired:
            pass
    running_before_term = p.poll() is None
    res["running_before_sigterm"] = running_before_term
    if running_before_term:
        time.sleep(0.5)  # it should be idling now: still alive?
        res["alive_0_5s_after_patch"] = p.poll() is None
        t1 = time.time()
        try:
            os.kill(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            res["killed"] = True
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait(timeout=5)
        res["exit_after_sigterm_s"] = round(time.time() - t1, 3)
    res["exit_code"] = p.returncode
    reqs = pod_requests(state, pod)
    anns = patched_annotations(reqs)
    for a in anns:
        if a.get(ANN_UUID):
            seen_uuid = a[ANN_UUID]
        if a.get(ANN_ERR):
            seen_err = a[ANN_ERR]
    res["patched_uuid"] = seen_uuid
    res["patched_error"] = seen_err
    res["requests"] = [f"{r['method']} {r['path']} -> {r['status']}" for r in reqs]
    res["patch_bodies"] = [r["body"] for r in reqs if r["method"] == "PATCH"]
    res["events_posted"] = [r["body"] for r in reqs if r["method"] == "POST"]
    try:
        with open(tl) as f:
            res["termination_log"] = f.read()
    except OSError:
        res["termination_log"] = None
    with open(agent_log, errors="replace") as f:
        res["agent_log"] = f.read()[-6000:]
    if expect_hold:
        res["ok"] = bool(seen_uuid) and running_before_term and p.returncode == 0
    else:
        res["ok"] = (not running_before_term) and p.returncode not in (0, None) \
            and bool(seen_err) and bool(res["events_posted"])
    log(f"    agent output:\n" + "\n".join("      | " + l for l in res["agent_log"].splitlines()))
    log(f"    requests: {res['requests']}")
    log(f"    patched uuid={seen_uuid!r} error={seen_err!r}")
    log(f"    events posted: {len(res['events_posted'])}; termination log: {res['termination_log']!r}")
    log(f"    exit code {p.returncode} (running before SIGTERM: {running_before_term}); "
        f"case {'OK' if res['ok'] else 'NOT OK'}")
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--requests-log", default=None)
    ap.add_argument("--json-out", required=True)
    ap.add_argument("--wait", type=float, default=20.0)
    ap.add_argument("--local", metavar="STANDIN_LIB", default=None,
                    help="no GPU here: load this stand-in libnvidia-ml.so.1 instead")
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    out = {"local_standin": a.local}
    if a.requests_log:
        open(a.requests_log, "w").close()
    srv, state, port = fake_kube.start_server(a.requests_log)
    kc = fake_kube.kubeconfig(port)
    with open(os.path.join(a.work, "kubeconfig"), "w") as f:
        f.write(kc)
    log(f"fake kube API on http://127.0.0.1:{port}; kubeconfig {os.path.join(a.work, 'kubeconfig')}")
    out["fake_api_port"] = port
    rc, o, e = run_cmd(["ldd", a.binary], 10)
    out["ldd"] = (o + "\n" + e).strip()
    log("ldd gpu-share:\n" + out["ldd"])
    if a.local:
        cases = [("standin-uuid", standin_env(a.work, "standin-uuid", FAKE_UUID), a.local, True),
                 ("standin-empty", standin_env(a.work, "standin-empty", None), a.local, False),
                 ("absent-lib", {}, "libnvidia-ml-absent.so.1", False)]
    else:
        cases = [("real", {}, None, True), ("absent-lib", {}, "libnvidia-ml-absent.so.1", False)]
    out["cases"] = {}
    for name, extra_env, lib, hold in cases:
        out["cases"][name] = run_case(name, a.binary, a.work, port, state, extra_env, lib, a.wait, hold)

    # The UUID as nvidia-smi and pynvml see it.
    rc, o, e = run_cmd(["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader"], 30)
    out["nvidia_smi_uuids"] = [l.strip() for l in o.splitlines() if l.strip()] if rc == 0 else None
    out["nvidia_smi_error"] = None if rc == 0 else (e or o or f"rc={rc}")
    code = ("import pynvml,json;pynvml.nvmlInit();n=pynvml.nvmlDeviceGetCount();"
            "u=[pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i)) for i in range(n)];"
            "print(json.dumps([x.decode() if isinstance(x,bytes) else x for x in u]))")
    rc, o, e = run_cmd([sys.executable, "-c", code], 30)
    try:
        out["pynvml_uuids"] = json.loads(o.splitlines()[-1]) if rc == 0 else None
    except (ValueError, IndexError):
        out["pynvml_uuids"] = None
    out["pynvml_error"] = None if out["pynvml_uuids"] is not None else (e[-800:] or o or f"rc={rc}")
    main_case = out["cases"].get("real") or out["cases"].get("standin-uuid")
    agent_uuid = main_case.get("patched_uuid") if main_case else None
    out["agent_uuid"] = agent_uuid
    out["matches_nvidia_smi"] = (agent_uuid is not None and out["nvidia_smi_uuids"] is not None
                                 and out["nvidia_smi_uuids"] == [agent_uuid])
    out["matches_pynvml"] = (agent_uuid is not None and out["pynvml_uuids"] is not None
                             and out["pynvml_uuids"] == [agent_uuid])
    log(f"UUID: agent={agent_uuid!r} nvidia-smi={out['nvidia_smi_uuids']!r} "
        f"({out['nvidia_smi_error'] or 'ok'}) pynvml={out['pynvml_uuids']!r} "
        f"({(out['pynvml_error'] or 'ok').splitlines()[-1] if (out['pynvml_error'] or 'ok') else ''})")
    log(f"matches nvidia-smi: {out['matches_nvidia_smi']}; matches pynvml: {out['matches_pynvml']}")
    out["ok"] = all(c.get("ok") for c in out["cases"].values())
    log(f"part B overall: {'OK' if out['ok'] else 'NOT OK'}")
    srv.shutdown()
    with open(a.json_out, "w") as f:
        json.dump(out, f, indent=1)
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""MPS per GPU on a real GPU, as a share in per-GPU form gets it: gpu-share's reservation
(`gpu-share reserve --mps --mps-dir ...`, a local process against a stand-in Kubernetes API) runs
the GPU's MPS daemon with no server defaults of its own (the reservation pod's arguments) and
writes the GPU's CDI device gpu-share.io/mps=<UUID> from NVIDIA's CDI spec; PyTorch clients then
run with what that device and their ConfigMap give them. Needs one NVIDIA GPU, its driver, root,
python3 with PyTorch, and a gpu-share binary:

  cp target/release/gpu-share tests/gpu/ && python3 benches/gpu/per_gpu_mps.py --out /tmp/out

Steps:
  P0  facts: driver, the GPU's minor number, whether nvidia-ctk is here
  P1  NVIDIA's CDI spec (nvidia-ctk cdi generate, else one written from the GPU's device nodes);
      the agent starts the daemon and writes the device: its name, its pipe variable and mounts,
      and the device node it copied, against the GPU's minor number
  P2  unequal shares at once, as mps-25 with 20Gi and mps-50 with 40Gi get them: each client's
      pinned limit is its budget (the ConfigMap's key) and its threads its percentage; each
      allocates past its budget
  P3  the same two run a bf16 matrix product at once: their throughputs' ratio
  P4  a client with a /dev/shm of its own (not the daemon's): does it run, and held?
  P5  a client of another user while one of root holds the server: does it wait?
  P6  SIGTERM: the device removed, the compute mode back to DEFAULT
The summary goes to OUT/per-gpu-mps.json; everything printed to OUT/per-gpu-mps-log.txt.
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
GPU_TESTS = os.path.join(ROOT, "tests", "gpu")
sys.path.insert(0, GPU_TESTS)
import fake_kube  # noqa: E402

T0 = time.time()
R = {"steps": {}, "answers": {}}
LOG = None


def log(*a):
    line = f"[per-gpu-mps +{time.time() - T0:6.1f}s] " + " ".join(str(x) for x in a)
    print(line, flush=True)
    if LOG:
        LOG.write(line + "\n")
        LOG.flush()


def sh(cmd, timeout=30):
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        return p.returncode, (p.stdout + p.stderr).strip()
    except Exception as e:  # noqa: BLE001
        return -1, f"{cmd[0]} failed: {e}"


def smi(*args):
    return sh(["nvidia-smi", *args])[1]


def client(label, env_extra, args, timeout=120, wrap=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUDA_MPS")}
    env.update(env_extra)
    env["PYTHONUNBUFFERED"] = "1"
    cmd = [sys.executable, "-u", os.path.join(GPU_TESTS, "torch_client.py"), "--label", label, *args]
    if wrap:
        cmd = wrap + cmd
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True), timeout


def result(proc_and_timeout):
    proc, timeout = proc_and_timeout
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        out += "\n(timed out)"
    for line in out.splitlines():
        if not line.startswith("RESULT "):
            log("   ", line)
    last = [l for l in out.splitlines() if l.startswith("RESULT ")]
    r = json.loads(last[-1][7:]) if last else {"error": "no result", "output": out[-2000:]}
    r["rc"] = proc.returncode
    return r


def held(r):
    return r.get("held_gib"), r.get("first_failure_cumulative_gib")


def minor_number():
    for line in smi("-q").splitlines():
        if "Minor Number" in line:
            return line.split(":")[-1].strip()
    return None


def nvidia_spec(work, minor):
    """NVIDIA's CDI spec for this machine: nvidia-ctk's where it is here, else one written from
    the GPU's device nodes (what the device's copy is checked against)."""
    specs = os.path.join(work, "specs")
    os.makedirs(specs, exist_ok=True)
    ctk = shutil.which("nvidia-ctk")
    if ctk:
        rc, out = sh([ctk, "cdi", "generate", f"--output={specs}/nvidia.yaml"], timeout=60)
        if rc == 0:
            return specs, f"nvidia-ctk cdi generate ({ctk})"
        log("nvidia-ctk cdi generate failed:", out[-1000:])
    nodes = sorted(p for p in os.listdir("/dev") if p.startswith("nvidia") and not p[6:].isdigit())
    spec = {
        "cdiVersion": "0.5.0",
        "kind": "nvidia.com/gpu",
        "devices": [{"name": "0", "containerEdits": {"deviceNodes": [{"path": f"/dev/nvidia{minor}"}]}}],
        "containerEdits": {"deviceNodes": [{"path": f"/dev/{n}"} for n in nodes if os.path.exists(f"/dev/{n}")]},
    }
    with open(os.path.join(specs, "nvidia.json"), "w") as f:
        json.dump(spec, f, indent=1)
    return specs, "written here from /dev/nvidia* (no nvidia-ctk)"


def main():
    global LOG
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/per-gpu-mps-out")
    ap.add_argument("--binary", default=os.path.join(GPU_TESTS, "gpu-share"))
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    LOG = open(os.path.join(a.out, "per-gpu-mps-log.txt"), "w")
    work = os.path.join("/tmp", f"gspg-{os.getpid()}")
    os.makedirs(work, exist_ok=True)
    agent = None
    logf = open(os.path.join(a.out, "agent.log"), "w")

    def save():
        R["wall_s"] = round(time.time() - T0, 1)
        with open(os.path.join(a.out, "per-gpu-mps.json"), "w") as f:
            json.dump(R, f, indent=2)

    try:
        minor = minor_number()
        R["steps"]["P0"] = {
            "uid": os.getuid(),
            "gpu": smi("--query-gpu=name,driver_version,memory.total,compute_mode,uuid", "--format=csv,noheader"),
            "minor": minor,
            "nvidia_ctk": shutil.which("nvidia-ctk"),
        }
        log("P0", R["steps"]["P0"])
        smi("-c", "DEFAULT")
        specs, source = nvidia_spec(work, minor)
        _, state, port = fake_kube.start_server(os.path.join(a.out, "fake-kube-requests.jsonl"))
        kubeconfig = os.path.join(work, "kubeconfig")
        with open(kubeconfig, "w") as f:
            f.write(fake_kube.kubeconfig(port))
        name = "gpu-share-node-gpu-0"
        env = dict(os.environ, KUBECONFIG=kubeconfig, POD_NAME=name,
                   POD_NAMESPACE="gpu-share-reservations", RUST_LOG="info")
        env.pop("KUBERNETES_SERVICE_HOST", None)
        mps_dir, cdi = os.path.join(work, "mps", "gpu-0"), os.path.join(work, "cdi")
        # The reservation pod's arguments (reservation::model::mps_pod), with directories here.
        agent = subprocess.Popen(
            [a.binary, "reserve", "--mps", "--mps-dir", mps_dir, "--cdi-dir", cdi, "--cdi-specs", specs,
             "--termination-log", os.path.join(work, "term")],
            env=env, stdout=logf, stderr=subprocess.STDOUT)

        def annotations():
            pod = state.pod("gpu-share-reservations", name)
            return (pod or {}).get("metadata", {}).get("annotations", {}) or {}

        start = time.time()
        while time.time() - start < 40 and not annotations().get("gpu-share.io/mps-pipe") and agent.poll() is None:
            time.sleep(0.1)
        ann = annotations()
        pipe = ann.get("gpu-share.io/mps-pipe")
        uuid = ann.get("gpu-share.io/gpu-uuid")
        device_path = os.path.join(cdi, f"gpu-share.io-mps-{uuid}.json")
        device = json.load(open(device_path)) if uuid and os.path.exists(device_path) else None
        edits = (device or {}).get("devices", [{}])[0].get("containerEdits", {})
        dev_env = dict(e.split("=", 1) for e in edits.get("env", []))
        nodes = [n["path"] for n in edits.get("deviceNodes", [])]
        R["steps"]["P1"] = {"spec_source": source, "pipe": pipe, "uuid": uuid, "published_after_s": round(time.time() - start, 2),
                            "compute_mode": smi("--query-gpu=compute_mode", "--format=csv,noheader"),
                            "device_name": (device or {}).get("devices", [{}])[0].get("name"),
                            "device_pipe_variable": dev_env.get("CUDA_MPS_PIPE_DIRECTORY"),
                            "device_nodes": nodes, "mounts": edits.get("mounts", [])[-2:],
                            "annotations": ann}
        R["answers"]["device_names_the_gpus_own_node"] = f"/dev/nvidia{minor}" in nodes
        R["answers"]["device_pipe_is_the_daemons"] = dev_env.get("CUDA_MPS_PIPE_DIRECTORY") == pipe
        log("P1", R["steps"]["P1"])
        if not pipe or not device:
            log("P1: no pipe or no device; the agent's log:", open(logf.name).read()[-3000:])
            return 1
        share_env = {"CUDA_MPS_PIPE_DIRECTORY": dev_env["CUDA_MPS_PIPE_DIRECTORY"]}

        # P2: unequal shares at once, each allocating past its budget in 4 GiB steps.
        p25 = client("mps-25-20Gi", dict(share_env, CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="0=20480M",
                                         CUDA_MPS_ACTIVE_THREAD_PERCENTAGE="25"),
                     ["--alloc", ",".join(["4"] * 6), "--hold", "4"])
        p50 = client("mps-50-40Gi", dict(share_env, CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="0=40960M",
                                         CUDA_MPS_ACTIVE_THREAD_PERCENTAGE="50"),
                     ["--alloc", ",".join(["4"] * 11), "--hold", "4"])
        r25, r50 = result(p25), result(p50)
        R["steps"]["P2"] = {"mps_25_20Gi_held_refused": held(r25), "mps_50_40Gi_held_refused": held(r50),
                            "a": r25, "b": r50}
        R["answers"]["unequal_budgets_held"] = (
            held(r25)[0] is not None and held(r50)[0] is not None
            and held(r25)[0] <= 20 and held(r50)[0] <= 40 and held(r50)[0] > 20)
        log("P2 held/refused-at:", held(r25), held(r50))

        # P3: both at once, a matrix product each.
        m25 = client("mps-25-mm", dict(share_env, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE="25"), ["--matmul", "5"])
        m50 = client("mps-50-mm", dict(share_env, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE="50"), ["--matmul", "5"])
        t25 = (result(m25).get("matmul") or {}).get("tflops")
        t50 = (result(m50).get("matmul") or {}).get("tflops")
        R["steps"]["P3"] = {"tflops_25": t25, "tflops_50": t50, "ratio_25_to_50": round(t25 / t50, 3) if t25 and t50 else None}
        log("P3", R["steps"]["P3"])

        # P4: a /dev/shm of its own.
        wrap = ["unshare", "-m", "--propagation", "private", "sh", "-c",
                'mount -t tmpfs tmpfs /dev/shm && exec "$@"', "sh"]
        r4 = result(client("own-shm", dict(share_env, CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="0=2048M"),
                           ["--alloc", "1,1,1,1"], timeout=60, wrap=wrap))
        R["steps"]["P4"] = {"stage": r4.get("stage"), "error": r4.get("error"), "held_refused": held(r4),
                            "output": r4.get("output", "")[-600:] if r4.get("error") == "no result" else None}
        R["answers"]["own_shm_client"] = (
            "unshare unavailable here" if r4.get("error") == "no result" else
            "fails to start (fail-closed)" if r4.get("stage") == "cuda_init" else
            f"runs, held at {held(r4)}")
        log("P4", R["steps"]["P4"])

        # P5: another user while root holds the server.
        holder = client("root-holds", share_env, ["--alloc", "1", "--hold", "15"])
        time.sleep(6)
        t = time.time()
        other = client("uid-65534", dict(share_env, HOME="/tmp"), ["--alloc", "1"], timeout=60,
                       wrap=["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"])
        r5h, r5o = result(holder), result(other)
        R["steps"]["P5"] = {"other_user": {"stage": r5o.get("stage"), "error": r5o.get("error"),
                                           "t_cuda_init_s": r5o.get("t_cuda_init_s"), "wall_s": r5o.get("wall_s"),
                                           "started_after_s": round(time.time() - t, 1)},
                            "holder_wall_s": r5h.get("wall_s")}
        log("P5", R["steps"]["P5"])

        # P6: release.
        agent.send_signal(signal.SIGTERM)
        try:
            rc6 = agent.wait(timeout=30)
        except subprocess.TimeoutExpired:
            rc6 = "still running"
        R["steps"]["P6"] = {"exit": rc6, "device_left": os.path.exists(device_path),
                            "compute_mode": smi("--query-gpu=compute_mode", "--format=csv,noheader")}
        log("P6", R["steps"]["P6"])
        return 0
    finally:
        if agent and agent.poll() is None:
            agent.send_signal(signal.SIGTERM)
            try:
                agent.wait(timeout=15)
            except subprocess.TimeoutExpired:
                agent.kill()
        smi("-c", "DEFAULT")
        logf.close()
        save()
        log("done; summary in", os.path.join(a.out, "per-gpu-mps.json"))


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Enforcement on a real GPU: gpu-share's own reservation code (`gpu-share reserve --mps`, a local
process against a stand-in Kubernetes API) runs the GPU's MPS daemon, and PyTorch clients show
what holds them. Needs one NVIDIA GPU, its driver (nvidia-smi, nvidia-cuda-mps-control), root
(the GPU's compute mode), python3 with PyTorch, and a gpu-share binary:

  cp target/release/gpu-share tests/gpu/ && python3 benches/gpu/enforce.py --out /tmp/out

Steps (each client its own process, tests/gpu/torch_client.py; GiB cumulative):
  E0  facts: driver, compute mode, whether NVML has nvmlDeviceSetMemoryLimits (r615)
  E1  the agent starts the daemon: the pipe published only once the defaults are set; the GPU's
      compute mode EXCLUSIVE_PROCESS
  E2  two clients at once, pinned limits 2 GiB and 4 GiB: each refused past its own
  E3  a client asking 12 GiB over the server's 6 GiB default: can a client raise its limit?
  E4  25% of the threads against 100%: a bf16 matrix product's throughput
  E5  the daemon killed: the compute modes seen meanwhile (PROHIBITED until it is back), the pipe
      published again, and a client held to its limit again
  E6  SIGTERM: quit, the compute mode back to DEFAULT
  E7  a daemon that does not come back (--mps-restarts 0): the failure on the pod, the GPU
      PROHIBITED while the reservation stays, clients with and without the pipe unable to start
      a context (fail-closed); then SIGTERM (the reservation goes): DEFAULT again
  E8  the driver's per-container limits (r615+): tried only where NVML has them
The summary goes to OUT/enforce.json; everything printed to OUT/enforce-log.txt.
"""

import argparse
import ctypes
import json
import os
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
    line = f"[enforce +{time.time() - T0:6.1f}s] " + " ".join(str(x) for x in a)
    print(line, flush=True)
    if LOG:
        LOG.write(line + "\n")
        LOG.flush()


def smi(*args, timeout=20):
    try:
        p = subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=timeout)
        return (p.stdout + p.stderr).strip()
    except Exception as e:  # noqa: BLE001
        return f"nvidia-smi failed: {e}"


def compute_mode():
    return smi("--query-gpu=compute_mode", "--format=csv,noheader")


def client(label, env_extra, args, timeout=90, use_pipe=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUDA_MPS")}
    if use_pipe:
        env["CUDA_MPS_PIPE_DIRECTORY"] = use_pipe
    env.update(env_extra)
    env["PYTHONUNBUFFERED"] = "1"
    cmd = [sys.executable, "-u", os.path.join(GPU_TESTS, "torch_client.py"), "--label", label, *args]
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


def run_client(label, env_extra, args, use_pipe=None, timeout=90):
    return result(client(label, env_extra, args, timeout=timeout, use_pipe=use_pipe))


def held(r):
    """GiB the client held before its first refused allocation, and where it was refused."""
    return r.get("held_gib"), r.get("first_failure_cumulative_gib")


class Agent:
    def __init__(self, binary, work, state, kubeconfig, restarts, name):
        self.state = state
        self.pod = name
        self.logf = open(os.path.join(work, f"agent-{name}.log"), "w")
        env = dict(os.environ)
        env.update({"KUBECONFIG": kubeconfig, "POD_NAME": name, "POD_NAMESPACE": "gpu-share-reservations",
                    "RUST_LOG": "info"})
        env.pop("KUBERNETES_SERVICE_HOST", None)
        self.proc = subprocess.Popen(
            [binary, "reserve", "--mps", "--mps-root", os.path.join(work, "mps"),
             "--mps-health-seconds", "1", "--mps-restarts", str(restarts),
             "--mps-pinned-memory-mib", "6144", "--termination-log", os.path.join(work, f"term-{name}")],
            env=env, stdout=self.logf, stderr=subprocess.STDOUT)

    def annotations(self):
        pod = self.state.pods.get(("gpu-share-reservations", self.pod)) if hasattr(self.state, "pods") else None
        if pod is None:
            pod = self.state.pod("gpu-share-reservations", self.pod)
        return (pod or {}).get("metadata", {}).get("annotations", {}) or {}

    def wait_pipe(self, limit=40):
        start = time.time()
        while time.time() - start < limit:
            a = self.annotations()
            if a.get("gpu-share.io/mps-pipe"):
                return a["gpu-share.io/mps-pipe"], round(time.time() - start, 2)
            if self.proc.poll() is not None:
                return None, round(time.time() - start, 2)
            time.sleep(0.1)
        return None, limit


def nvml_has_memory_limits():
    try:
        lib = ctypes.CDLL("libnvidia-ml.so.1")
        return hasattr(lib, "nvmlDeviceSetMemoryLimits_v1") or hasattr(lib, "nvmlDeviceSetMemoryLimits")
    except OSError as e:
        return f"cannot load NVML: {e}"


# The kernel keeps 15 characters of a process's name: the control daemon and the server are
# both "nvidia-cuda-mps". Matched by that name (-x), never by command line: a shell whose command
# names the daemon would be killed too.
MPS_COMM = "nvidia-cuda-mps"


def kill_daemon():
    return subprocess.run(["pkill", "-9", "-x", MPS_COMM], capture_output=True).returncode


def main():
    global LOG
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/enforce-out")
    ap.add_argument("--binary", default=os.path.join(GPU_TESTS, "gpu-share"))
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    LOG = open(os.path.join(a.out, "enforce-log.txt"), "w")
    work = os.path.join("/tmp", f"gsenf-{os.getpid()}")
    os.makedirs(work, exist_ok=True)
    agents = []

    def save():
        R["wall_s"] = round(time.time() - T0, 1)
        with open(os.path.join(a.out, "enforce.json"), "w") as f:
            json.dump(R, f, indent=2)

    def stop_all(*_):
        for ag in agents:
            if ag.proc.poll() is None:
                ag.proc.send_signal(signal.SIGTERM)
        smi("-c", "DEFAULT")
        save()

    signal.signal(signal.SIGTERM, lambda *_: (stop_all(), sys.exit(130)))
    try:
        # E0
        R["steps"]["E0"] = {
            "uid": os.getuid(),
            "gpu": smi("--query-gpu=name,driver_version,memory.total,compute_mode", "--format=csv,noheader"),
            "nvml_set_memory_limits": nvml_has_memory_limits(),
        }
        log("E0", R["steps"]["E0"])
        smi("-c", "DEFAULT")
        _, state, port = fake_kube.start_server(os.path.join(a.out, "fake-kube-requests.jsonl"))
        kubeconfig = os.path.join(work, "kubeconfig")
        with open(kubeconfig, "w") as f:
            f.write(fake_kube.kubeconfig(port))

        # E1
        ag = Agent(a.binary, work, state, kubeconfig, 3, "gpu-share-gpu-0")
        agents.append(ag)
        pipe, took = ag.wait_pipe()
        R["steps"]["E1"] = {"pipe": pipe, "published_after_s": took, "compute_mode": compute_mode(),
                            "annotations": ag.annotations()}
        log("E1", R["steps"]["E1"])
        if not pipe:
            log("E1: no pipe published; the agent's log:", open(ag.logf.name).read()[-3000:])
            return 1

        # E2: two clients at once, each to its own limit.
        pa = client("A-2G", {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=2048M"}, ["--alloc", "1,1,1,1", "--hold", "4"], use_pipe=pipe)
        pb = client("B-4G", {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=4096M"}, ["--alloc", "1,1,1,1,1,1", "--hold", "4"], use_pipe=pipe)
        ra, rb = result(pa), result(pb)
        R["steps"]["E2"] = {"A_2G": held(ra), "B_4G": held(rb), "A": ra, "B": rb}
        log("E2 held/refused-at:", held(ra), held(rb))

        # E3: above the server's default.
        rc = run_client("C-12G", {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=12288M"}, ["--alloc", "2,2,2,2,2,2"], use_pipe=pipe)
        R["steps"]["E3"] = {"held_refused": held(rc), "client": rc}
        R["answers"]["client_can_raise_over_server_default"] = (
            None if held(rc)[0] is None else held(rc)[0] > 6.0)
        log("E3 asked 12 GiB over a 6 GiB default: held/refused-at", held(rc))

        # E4: thread percentage.
        r100 = run_client("D-100", {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100"}, ["--matmul", "3"], use_pipe=pipe)
        r25 = run_client("D-25", {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25"}, ["--matmul", "3"], use_pipe=pipe)
        t100 = (r100.get("matmul") or {}).get("tflops")
        t25 = (r25.get("matmul") or {}).get("tflops")
        R["steps"]["E4"] = {"tflops_100": t100, "tflops_25": t25,
                            "ratio": round(t25 / t100, 3) if t100 and t25 else None}
        log("E4", R["steps"]["E4"])

        # E5: the daemon killed under the agent.
        kill_daemon()
        seen, start = [], time.time()
        while time.time() - start < 20:
            m = compute_mode()
            if not seen or seen[-1][1] != m:
                seen.append((round(time.time() - start, 2), m))
            a5 = ag.annotations()
            if len(seen) > 1 and a5.get("gpu-share.io/mps-pipe") and "Exclusive" in m:
                break
            time.sleep(0.05)
        rg = run_client("G-2G-after", {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=2048M"}, ["--alloc", "1,1,1,1"], use_pipe=pipe)
        R["steps"]["E5"] = {"compute_modes_seen": seen, "pipe_again": ag.annotations().get("gpu-share.io/mps-pipe"),
                            "held_refused_after": held(rg)}
        log("E5", R["steps"]["E5"])

        # E6: release.
        ag.proc.send_signal(signal.SIGTERM)
        try:
            rc6 = ag.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            rc6 = "still running"
        R["steps"]["E6"] = {"exit": rc6, "compute_mode": compute_mode(),
                            "daemons_left": subprocess.run(["pgrep", "-c", "-x", MPS_COMM], capture_output=True, text=True).stdout.strip()}
        log("E6", R["steps"]["E6"])

        # E7: a daemon that does not come back.
        ag2 = Agent(a.binary, work, state, kubeconfig, 0, "gpu-share-gpu-0-b")
        agents.append(ag2)
        pipe2, _ = ag2.wait_pipe()
        kill_daemon()
        start = time.time()
        while time.time() - start < 30 and not ag2.annotations().get("gpu-share.io/reserve-error"):
            time.sleep(0.1)
        failed_after = round(time.time() - start, 2)
        mode7 = compute_mode()
        re_ = run_client("E-pipe", {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=2048M"}, ["--alloc", "4"], use_pipe=pipe2)
        rf = run_client("F-no-mps", {}, ["--alloc", "4"])
        alive = ag2.proc.poll() is None
        # The reservation goes: the GPU takes any process again.
        ag2.proc.send_signal(signal.SIGTERM)
        try:
            rc7 = ag2.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            rc7 = "still running"
        R["steps"]["E7"] = {"failure_on_the_pod_after_s": failed_after, "compute_mode": mode7,
                            "agent_alive_meanwhile": alive, "agent_exit_after_sigterm": rc7,
                            "compute_mode_after_sigterm": compute_mode(),
                            "annotations": ag2.annotations(),
                            "client_with_pipe": {"stage": re_.get("stage"), "error": re_.get("error"), "held": held(re_)},
                            "client_without_mps": {"stage": rf.get("stage"), "error": rf.get("error"), "held": held(rf)}}
        R["answers"]["fail_closed_when_the_daemon_is_gone"] = (
            re_.get("stage") == "cuda_init" and rf.get("stage") == "cuda_init")
        log("E7", R["steps"]["E7"])
        smi("-c", "DEFAULT")

        # E8: the driver's per-container limits.
        has = R["steps"]["E0"]["nvml_set_memory_limits"]
        R["steps"]["E8"] = {"tried": has is True,
                            "why_not": None if has is True else
                            f"NVML has no nvmlDeviceSetMemoryLimits here ({R['steps']['E0']['gpu']}): r615 or later needed"}
        log("E8", R["steps"]["E8"])
        return 0
    finally:
        stop_all()
        for ag in agents:
            try:
                ag.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                ag.proc.kill()
            ag.logf.close()
            with open(ag.logf.name) as src, open(os.path.join(a.out, os.path.basename(ag.logf.name)), "w") as dst:
                dst.write(src.read())
        log("done; summary in", os.path.join(a.out, "enforce.json"))


if __name__ == "__main__":
    sys.exit(main())

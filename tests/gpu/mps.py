#!/usr/bin/env python3
"""Part C: MPS as a budget holder. Starts its own MPS control daemon (pipe and log directories
under --work), runs torch_client.py processes with MPS settings, and writes a JSON summary.

Order (each client a separate process; later tests are skipped when the deadline nears, C6's
dead-pipe test always keeps its time):
  C1  no MPS: mem_get_info, allocate 4 GiB, matmul baseline
  C6b pipe dir that never existed + CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=2G: allocate 4 (limit held?)
  -- start the daemon --
  C2  env 0=4G: allocations 2,1,2
  C3  restart; set_default_device_pinned_mem_limit 0 3G; no env: 2,2
  C4  (same server) env 0=8G above the default 3G: 2,2,2
  C5a/C5b env ACTIVE_THREAD_PERCENTAGE 100 / 25: matmul
  C5c restart; set_default_active_thread_percentage 25; no env: matmul
  C7  two concurrent clients, env 0=2G each: 1,1,1 held 4 s
  -- quit the daemon --
  C6a the now-dead pipe dir + env 0=2G: allocate 4
"""

import argparse
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
CLIENT = os.path.join(HERE, "torch_client.py")
MPS_DIRS = ["/usr/bin", "/usr/local/nvidia/bin", "/usr/local/cuda/bin"]
T0 = time.time()
OUT = {"tests": {}, "control": [], "skipped": {}}
STATE = {"mps": None, "json_out": None, "written": False, "clients": []}


class Terminated(Exception):
    pass


def on_term(signum, frame):
    raise Terminated(f"signal {signum}")


def log(*a):
    print(f"[mps +{time.time() - T0:5.1f}s]", *a, flush=True)


def find(name):
    w = shutil.which(name)
    if w:
        return w
    for d in MPS_DIRS + sorted(glob.glob("/usr/local/cuda-*/bin")):
        p = os.path.join(d, name)
        if os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    return None


class Mps:
    def __init__(self, control, pipe, logdir):
        self.control = control
        self.pipe = pipe
        self.logdir = logdir
        self.running = False

    def env(self):
        e = base_env()
        e["CUDA_MPS_PIPE_DIRECTORY"] = self.pipe
        e["CUDA_MPS_LOG_DIRECTORY"] = self.logdir
        return e

    def ctl(self, cmd, timeout=10):
        try:
            p = subprocess.run([self.control], input=cmd + "\n", capture_output=True, text=True,
                               env=self.env(), timeout=timeout)
            r = {"cmd": cmd, "rc": p.returncode, "out": p.stdout.strip(), "err": p.stderr.strip()}
        except subprocess.TimeoutExpired:
            r = {"cmd": cmd, "rc": None, "out": "", "err": f"timed out after {timeout}s"}
        except OSError as e:
            r = {"cmd": cmd, "rc": None, "out": "", "err": str(e)}
        OUT["control"].append(r)
        log(f"control `{cmd}` -> rc={r['rc']} out={r['out']!r} err={r['err']!r}")
        return r

    def start(self):
        os.makedirs(self.pipe, exist_ok=True)
        os.makedirs(self.logdir, exist_ok=True)
        try:
            p = subprocess.run([self.control, "-d"], capture_output=True, text=True, env=self.env(), timeout=15)
            r = {"rc": p.returncode, "out": p.stdout.strip(), "err": p.stderr.strip()}
        except subprocess.TimeoutExpired:
            r = {"rc": None, "out": "", "err": "timed out after 15s"}
        except OSError as e:
            r = {"rc": None, "out": "", "err": str(e)}
        log(f"`{self.control} -d` -> {r}")
        time.sleep(0.5)
        probe = self.ctl("get_server_list", 10)
        r["probe"] = probe
        r["pipe_dir_after"] = sorted(os.listdir(self.pipe)) if os.path.isdir(self.pipe) else None
        r["ok"] = r["rc"] == 0 and probe["rc"] == 0 and "ERR" not in (probe["out"] + probe["err"]).upper()
        r["control_log_tail"] = tail(os.path.join(self.logdir, "control.log"), 30)
        if not r["ok"]:
            log(f"MPS daemon did not start: {r}\ncontrol.log:\n{r['control_log_tail']}")
        self.running = r["ok"]
        return r

    def ours(self):
        """PIDs of MPS processes started with our pipe directory."""
        pids = []
        for d in glob.glob("/proc/[0-9]*"):
            try:
                with open(d + "/comm") as f:
                    comm = f.read().strip()
                if not comm.startswith("nvidia-cuda-mps"):
                    continue
                try:
                    with open(d + "/environ", "rb") as f:
                        env = f.read()
                    if self.pipe.encode() not in env:
                        continue
                except OSError:
                    pass  # unreadable environ: an MPS process on this dedicated machine, ours
                pids.append((int(d[6:]), comm))
            except (OSError, ValueError):
                continue
        return pids

    def stop(self):
        r = self.ctl("quit", 20)
        t = time.time()
        while self.ours() and time.time() - t < 8:
            time.sleep(0.25)
        left = self.ours()
        if left:
            log(f"MPS processes still alive after quit: {left}; SIGTERM, then SIGKILL")
            for pid, _ in left:
                try:
                    os.kill(pid, signal.SIGTERM)
                except OSError:
                    pass
            time.sleep(2)
            for pid, _ in self.ours():
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        r["left_after_quit"] = left
        r["pipe_dir_after"] = sorted(os.listdir(self.pipe)) if os.path.isdir(self.pipe) else None
        log(f"pipe dir after quit: {r['pipe_dir_after']}")
        self.running = False
        return r


def tail(path, n):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError as e:
        return f"<{e}>"


def base_env():
    e = {k: v for k, v in os.environ.items() if not k.startswith("CUDA_MPS")}
    e["PYTHONUNBUFFERED"] = "1"
    return e


def start_client(label, args, env):
    argv = [sys.executable, "-u", CLIENT, "--label", label] + args
    shown = {k: v for k, v in env.items() if k.startswith("CUDA_MPS")}
    log(f"client {label}: {' '.join(argv[3:])} env {shown}")
    p = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    lines = []

    def pump():
        for line in p.stdout:
            lines.append(line.rstrip("\n"))
            if not line.startswith("RESULT "):
                print("    " + line.rstrip("\n"), flush=True)

    th = threading.Thread(target=pump, daemon=True)
    th.start()
    STATE["clients"].append(p)
    return {"label": label, "p": p, "lines": lines, "thread": th, "t0": time.time(), "env": shown}


def finish_client(c, timeout):
    p = c["p"]
    timed_out = False
    try:
        p.wait(timeout=max(1.0, timeout - (time.time() - c["t0"])))
    except subprocess.TimeoutExpired:
        timed_out = True
        log(f"client {c['label']} timed out after {timeout:.0f}s: killing its process group")
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except OSError:
            pass
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
    c["thread"].join(timeout=3)
    res = None
    for line in c["lines"]:
        if line.startswith("RESULT "):
            try:
                res = json.loads(line[7:])
            except ValueError:
                pass
    out = {"rc": p.returncode, "timed_out": timed_out, "wall_s": round(time.time() - c["t0"], 1),
           "env": c["env"], "result": res}
    if res is None:
        out["output_tail"] = "\n".join(c["lines"][-30:])
    return out


def run_client(label, args, env, timeout):
    return finish_client(start_client(label, args, env), timeout)


def alloc_summary(r):
    res = (r or {}).get("result") or {}
    return {
        "cuda_ok": "mem_get_info_start" in res,
        "stage": res.get("stage"),
        "error": res.get("error") or ((r or {}).get("output_tail") or "")[-300:] or None,
        "total_gib_seen": (res.get("mem_get_info_start") or {}).get("total_gib"),
        "free_gib_seen": (res.get("mem_get_info_start") or {}).get("free_gib"),
        "held_gib": res.get("held_gib"),
        "first_failure_cumulative_gib": res.get("first_failure_cumulative_gib"),
        "failure_text": next((s.get("error") for s in res.get("alloc", []) if not s.get("ok")), None),
        "smi_self_is_mps_client": res.get("smi_self_is_mps_client"),
        "smi_mps_server_listed": res.get("smi_mps_server_listed"),
        "tflops": (res.get("matmul") or {}).get("tflops"),
        "timed_out": (r or {}).get("timed_out"),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", required=True)
    ap.add_argument("--json-out", required=True)
    ap.add_argument("--logs-out", default=None)
    ap.add_argument("--budget", type=float, default=250.0, help="seconds for all of part C")
    ap.add_argument("--client-timeout", type=float, default=60.0)
    ap.add_argument("--matmul-s", type=float, default=3.0)
    a = ap.parse_args()
    STATE["json_out"] = a.json_out
    deadline = T0 + a.budget
    reserve_c6 = 45.0  # kept for quit + C6a + logs
    ct = {"t": a.client_timeout}

    def left():
        return deadline - time.time()

    def may(name, need, keep=reserve_c6):
        if left() - keep >= need:
            return True
        OUT["skipped"][name] = f"not enough time: {left():.0f}s left, needs {need:.0f}+{keep:.0f}"
        log(f"SKIP {name}: {OUT['skipped'][name]}")
        return False

    def tmo(keep=reserve_c6):
        return max(10.0, min(ct["t"], left() - keep + 10))

    def record(name, r, **extra):
        s = alloc_summary(r)
        s.update(extra)
        OUT["tests"][name] = {"summary": s, "raw": r}
        log(f"{name} summary: {json.dumps(s)}")
        if s.get("timed_out"):
            ct["t"] = min(ct["t"], 30.0)  # a hung client: don't spend a full minute on each of the rest
        return s

    work = os.path.abspath(a.work)
    os.makedirs(work, exist_ok=True)
    pipe = os.path.join(work, "mps-pipe")
    logdir = os.path.join(work, "mps-log")
    never = os.path.join(work, "never-existed-pipe")
    control = find("nvidia-cuda-mps-control")
    server = find("nvidia-cuda-mps-server")
    OUT["binaries"] = {"nvidia-cuda-mps-control": control or "absent", "nvidia-cuda-mps-server": server or "absent"}
    log(f"MPS binaries: {OUT['binaries']}")
    mm = ["--matmul", str(a.matmul_s)]

    # C1: no MPS at all.
    if may("C1", 20):
        log("=== C1 baseline, no MPS")
        r = run_client("C1", ["--alloc", "4"] + mm + ["--smi"], base_env(), tmo())
        s = record("C1", r)
        s["verdict"] = "4 GiB allocated without MPS" if s["held_gib"] == 4.0 else "baseline allocation FAILED"

    # C6b: a pipe directory that never existed: does CUDA run without MPS, ignoring the limit?
    if may("C6b", 15):
        log("=== C6b pipe dir that never existed, CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=2G, allocate 4 GiB")
        env = base_env()
        env.update(CUDA_MPS_PIPE_DIRECTORY=never, CUDA_MPS_LOG_DIRECTORY=logdir,
                   CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="0=2G")
        r = run_client("C6b", ["--alloc", "4", "--smi"], env, tmo())
        s = record("C6b", r)
        s["verdict"] = fail_verdict(s)

    mps = None
    if control:
        log("=== start the MPS control daemon")
        mps = Mps(control, pipe, logdir)
        STATE["mps"] = mps
        OUT["daemon_start_1"] = mps.start()
    else:
        OUT["daemon_start_1"] = {"ok": False, "err": "nvidia-cuda-mps-control not found (PATH, "
                                 + ", ".join(MPS_DIRS) + ", /usr/local/cuda-*/bin)"}
        log("MPS: nvidia-cuda-mps-control ABSENT: C2-C5, C7 skipped")
    up = bool(mps and mps.running)
    if not up:
        for n in ("C2", "C3", "C4", "C5a", "C5b", "C5c", "C7"):
            OUT["skipped"].setdefault(n, "MPS daemon not running")

    if up and may("C2", 20):
        log("=== C2 client env CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=4G: allocate 2,1,2")
        env = mps.env()
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = "0=4G"
        r = run_client("C2", ["--alloc", "2,1,2", "--smi"], env, tmo())
        s = record("C2", r)
        s["expect"] = "total ~4 GiB, failure at cumulative 5 (or earlier)"
        s["limit_enforced"] = s["first_failure_cumulative_gib"] is not None and s["first_failure_cumulative_gib"] <= 5
        OUT["server_list_after_C2"] = mps.ctl("get_server_list")
        for pid in OUT["server_list_after_C2"]["out"].split():
            mps.ctl(f"get_device_client_list {pid}")
        if not s["cuda_ok"]:
            log("C2: the first MPS client could not start CUDA; the MPS tests below will likely fail too")

    if up and may("C3", 25):
        log("=== C3 restart daemon, set_default_device_pinned_mem_limit 0 3G, client without env: allocate 2,2")
        OUT["stop_before_C3"] = mps.stop()
        OUT["daemon_start_C3"] = mps.start()
        up = mps.running
        if up:
            OUT["set_default_mem"] = mps.ctl("set_default_device_pinned_mem_limit 0 3G")
            OUT["get_default_mem"] = mps.ctl("get_default_device_pinned_mem_limit 0")
            r = run_client("C3", ["--alloc", "2,2"], mps.env(), tmo())
            s = record("C3", r)
            s["expect"] = "failure at cumulative 4 (server default 3G)"
            s["limit_enforced"] = s["first_failure_cumulative_gib"] is not None and s["first_failure_cumulative_gib"] <= 4
            OUT["server_list_after_C3"] = mps.ctl("get_server_list")

    if up and may("C4", 20):
        log("=== C4 server default 3G, client env 0=8G: allocate 2,2,2")
        env = mps.env()
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = "0=8G"
        r = run_client("C4", ["--alloc", "2,2,2"], env, tmo())
        s = record("C4", r)
        f = s["first_failure_cumulative_gib"]
        if not s["cuda_ok"]:
            s["verdict"] = "client failed to start CUDA (a client asking above the server default may be refused)"
        elif f is None:
            s["verdict"] = "client env (8G) wins: 6 GiB allocated above the server default 3G"
        elif f <= 4:
            s["verdict"] = f"server default (3G) wins: failed at cumulative {f}"
        else:
            s["verdict"] = f"failed at cumulative {f}"

    for name, pct in (("C5a", "100"), ("C5b", "25")):
        if up and may(name, 22):
            log(f"=== {name} CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={pct}: matmul")
            env = mps.env()
            env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = pct
            r = run_client(name, mm, env, tmo())
            record(name, r, active_thread_percentage=int(pct))

    if up and may("C5c", 30):
        log("=== C5c restart daemon, set_default_active_thread_percentage 25, client without env: matmul")
        OUT["stop_before_C5c"] = mps.stop()
        OUT["daemon_start_C5c"] = mps.start()
        up = mps.running
        if up:
            OUT["set_default_threads"] = mps.ctl("set_default_active_thread_percentage 25")
            OUT["get_default_threads"] = mps.ctl("get_default_active_thread_percentage")
            r = run_client("C5c", mm, mps.env(), tmo())
            record("C5c", r, active_thread_percentage="server default 25")

    def tf(n):
        return ((OUT["tests"].get(n) or {}).get("summary") or {}).get("tflops")

    c5 = {"no_mps_C1": tf("C1"), "env100_C5a": tf("C5a"), "env25_C5b": tf("C5b"), "default25_C5c": tf("C5c")}
    if c5["env100_C5a"] and c5["env25_C5b"]:
        c5["ratio_env25_over_env100"] = round(c5["env25_C5b"] / c5["env100_C5a"], 3)
    if c5["env100_C5a"] and c5["default25_C5c"]:
        c5["ratio_default25_over_env100"] = round(c5["default25_C5c"] / c5["env100_C5a"], 3)
    OUT["C5_tflops"] = c5
    log(f"C5 TFLOP/s: {c5}")

    if up and may("C7", 25):
        log("=== C7 two concurrent clients, env 0=2G each: allocate 1,1,1 and hold 4 s")
        cs = []
        for lbl in ("C7-1", "C7-2"):
            env = mps.env()
            env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = "0=2G"
            extra = ["--smi"] if lbl == "C7-2" else []
            cs.append(start_client(lbl, ["--alloc", "1,1,1", "--hold", "4"] + extra, env))
        t = tmo()
        t7 = time.time()

        def settled(c):
            return c["p"].poll() is not None or any(
                "cumulative 3.0" in l or "FAILED" in l or "CUDA init failed" in l for l in c["lines"])

        while time.time() - t7 < min(30.0, t - 10) and not all(settled(c) for c in cs):
            time.sleep(0.2)
        # Both hold their memory now (4 s): what does the daemon see?
        OUT["server_list_during_C7"] = mps.ctl("get_server_list")
        for pid in OUT["server_list_during_C7"]["out"].split():
            mps.ctl(f"get_device_client_list {pid}")
        rs = [finish_client(c, t) for c in cs]
        s1 = record("C7-1", rs[0])
        s2 = record("C7-2", rs[1])
        OUT["C7_verdict"] = {
            "both_limited": all(x["first_failure_cumulative_gib"] is not None and x["first_failure_cumulative_gib"] <= 3
                                for x in (s1, s2)),
            "failures_at": [s1["first_failure_cumulative_gib"], s2["first_failure_cumulative_gib"]],
        }

    if mps is not None:
        log("=== stop the MPS daemon (quit)")
        OUT["stop_final"] = mps.stop()

    if may("C6a", 12, keep=5):
        log("=== C6a the now-dead pipe dir + CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=2G: allocate 4 GiB")
        env = base_env()
        env.update(CUDA_MPS_PIPE_DIRECTORY=pipe, CUDA_MPS_LOG_DIRECTORY=logdir,
                   CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="0=2G")
        OUT["dead_pipe_dir_contents"] = sorted(os.listdir(pipe)) if os.path.isdir(pipe) else None
        r = run_client("C6a", ["--alloc", "4", "--smi"], env, tmo(keep=5))
        s = record("C6a", r)
        s["verdict"] = fail_verdict(s)

    OUT["fail_open"] = {n: ((OUT["tests"].get(n) or {}).get("summary") or {}).get("verdict") for n in ("C6a", "C6b")}
    log(f"C6 fail-open answer: {OUT['fail_open']}")

    logs = []
    for f in sorted(glob.glob(os.path.join(logdir, "*"))):
        logs.append(f"===== {f}\n" + tail(f, 300))
    OUT["mps_logs_tail"] = {os.path.basename(f): tail(f, 40) for f in glob.glob(os.path.join(logdir, "*"))}
    text = "\n".join(logs) if logs else "<no MPS logs>"
    log("MPS logs:\n" + text)
    if a.logs_out:
        with open(a.logs_out, "w") as f:
            f.write(text + "\n")
    OUT["wall_s"] = round(time.time() - T0, 1)
    write_json()
    log(f"part C done in {OUT['wall_s']}s; skipped: {OUT['skipped']}")
    return 0


def fail_verdict(s):
    if s.get("timed_out"):
        return "FAIL-CLOSED? the client hung (timed out) instead of running without MPS"
    if s.get("stage") == "import" or (not s["cuda_ok"] and s.get("stage") is None):
        return f"INCONCLUSIVE: the client did not reach CUDA ({s['error']})"
    if not s["cuda_ok"]:
        return f"FAIL-CLOSED: CUDA did not start ({s['error']})"
    if s["held_gib"] == 4.0:
        return "FAIL-OPEN: ran without MPS, 4 GiB allocated, the 2G limit NOT held"
    if s["first_failure_cumulative_gib"] is not None:
        return f"limit held: allocation failed at {s['first_failure_cumulative_gib']} GiB ({s['failure_text']})"
    return "unclear"


def write_json():
    if STATE["json_out"]:
        with open(STATE["json_out"], "w") as f:
            json.dump(OUT, f, indent=1, default=str)
        STATE["written"] = True


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, on_term)
    rc = 1
    try:
        rc = main()
    except BaseException as e:  # noqa: BLE001
        import traceback
        OUT["aborted"] = f"{type(e).__name__}: {e}"
        log(f"part C ABORTED: {OUT['aborted']}\n{traceback.format_exc()}")
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        for p in STATE["clients"]:
            if p.poll() is None:
                log(f"cleanup: killing client pid {p.pid}")
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except OSError:
                    pass
        m = STATE["mps"]
        if m is not None and (m.running or m.ours()):
            log("cleanup: stopping the MPS daemon")
            try:
                OUT["stop_cleanup"] = m.stop()
            except Exception as e:  # noqa: BLE001
                log(f"cleanup failed: {e}")
        if not STATE["written"] or "aborted" in OUT:
            OUT["wall_s"] = round(time.time() - T0, 1)
            write_json()
    sys.exit(rc)

#!/usr/bin/env python3
"""Part A: facts about the GPU machine. Each command has its own timeout; nothing here fails the
run. Prints everything, writes a JSON summary (--json-out) and `nvidia-smi -q` (--smi-q-out)."""

import argparse
import ctypes
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys

RESULTS = {}
MPS_DIRS = ["/usr/bin", "/usr/local/nvidia/bin", "/usr/local/cuda/bin"]


def log(*a):
    print(*a, flush=True)


def sh(name, cmd, timeout=20, quiet=False, keep=8000):
    try:
        p = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=timeout)
        out, rc = (p.stdout + (("\n[stderr] " + p.stderr.strip()) if p.stderr.strip() else "")).strip(), p.returncode
    except subprocess.TimeoutExpired:
        out, rc = f"[timed out after {timeout}s]", None
    RESULTS[name] = {"cmd": cmd, "rc": rc, "out": out[-keep:]}
    if not quiet:
        log(f"$ {cmd}   (rc={rc})")
        log("\n".join("  " + l for l in out.splitlines()) if out else "  <no output>")
    return rc, out


def which_in(name, dirs):
    found = []
    w = shutil.which(name)
    if w:
        found.append(w)
    for d in dirs + sorted(glob.glob("/usr/local/cuda-*/bin")):
        p = os.path.join(d, name)
        if os.path.isfile(p) and os.access(p, os.X_OK) and p not in found:
            found.append(p)
    return found


def nvml_path():
    """Where libnvidia-ml.so.1 resolves (loaded in a child, read from its /proc/self/maps)."""
    code = ("import ctypes,sys\n"
            "try:\n ctypes.CDLL('libnvidia-ml.so.1')\n"
            "except OSError as e:\n print('ERR', e); sys.exit(1)\n"
            "for l in open('/proc/self/maps'):\n"
            " if 'libnvidia-ml' in l: print(l.split()[-1]); break\n")
    try:
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=20)
        out = p.stdout.strip()
        if p.returncode == 0 and out:
            return out.splitlines()[0], None
        return None, out or p.stderr.strip()
    except subprocess.TimeoutExpired:
        return None, "timed out loading libnvidia-ml.so.1"


D = {}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json-out", required=True)
    ap.add_argument("--smi-q-out", default=None)
    a = ap.parse_args()
    d = D
    d["_json_out"] = a.json_out

    def on_term(signum, frame):
        raise SystemExit(f"facts: stopped by signal {signum}")

    signal.signal(signal.SIGTERM, on_term)

    log("--- A1: GPU (nvidia-smi)")
    sh("nvidia_smi", "nvidia-smi", 30)
    sh("nvidia_smi_query", "nvidia-smi --query-gpu=index,name,uuid,driver_version,memory.total,memory.used,"
       "mig.mode.current,compute_mode,persistence_mode,pci.bus_id,power.limit --format=csv", 30)
    rc, q = sh("nvidia_smi_q", "nvidia-smi -q", 40, quiet=True, keep=200000)
    if a.smi_q_out:
        with open(a.smi_q_out, "w") as f:
            f.write(q)
    keys = ["Driver Version", "CUDA Version", "Product Name", "Product Brand", "Product Architecture",
            "Current", "Pending", "Compute Mode", "Total", "Virtualization Mode", "Host VGPU Mode",
            "Addressing Mode", "Persistence Mode", "GPU UUID", "Bus Id", "Confidential Compute"]
    summary = []
    for line in q.splitlines():
        s = line.strip()
        if any(s.startswith(k) for k in keys):
            summary.append(s)
    d["nvidia_smi_q_summary"] = summary[:60]
    log("nvidia-smi -q summary:\n" + "\n".join("  " + s for s in summary[:60]))
    m = re.search(r"CUDA Version\s*:\s*(\S+)", q)
    d["cuda_version"] = m.group(1) if m else None
    m = re.search(r"Driver Version\s*:\s*(\S+)", q)
    d["driver_version"] = m.group(1) if m else None
    sh("dev_nvidia", "ls -la /dev/nvidia* 2>&1 | head -30", 10)

    log("--- A2: system")
    sh("uname", "uname -a", 5)
    sh("os_release", "grep PRETTY_NAME /etc/os-release; ldd --version 2>&1 | head -1; id", 5)
    sh("virt", "(systemd-detect-virt 2>/dev/null || echo 'systemd-detect-virt: n/a'); "
       "cat /sys/class/dmi/id/sys_vendor /sys/class/dmi/id/product_name 2>/dev/null; "
       "grep -m1 -o hypervisor /proc/cpuinfo; (dmesg 2>&1 | head -5); cat /proc/version; nproc; "
       "grep MemTotal /proc/meminfo", 10)

    log("--- A3: cgroups (dmem?)")
    rc, ctrl = sh("cgroup_controllers", "cat /sys/fs/cgroup/cgroup.controllers", 5)
    d["cgroup_controllers"] = ctrl.split() if rc == 0 else None
    rc2, ctrl2 = sh("cgroup_controllers_unified", "cat /sys/fs/cgroup/unified/cgroup.controllers", 5)
    d["cgroup_controllers_unified"] = ctrl2.split() if rc2 == 0 else None
    d["cgroup_v2_root"] = rc == 0
    d["dmem_controller"] = bool((rc == 0 and "dmem" in ctrl.split()) or (rc2 == 0 and "dmem" in ctrl2.split()))
    sh("proc_filesystems_cgroup", "grep cgroup /proc/filesystems", 5)
    sh("cgroup_mounts", "mount | grep -i cgroup", 5)
    sh("cgroup_more", "cat /proc/self/cgroup; echo '# subtree_control:'; cat /sys/fs/cgroup/cgroup.subtree_control; "
       "echo '# dmem files:'; ls /sys/fs/cgroup 2>/dev/null | grep -i dmem; cat /sys/fs/cgroup/dmem.capacity 2>&1 | head; "
       "echo '# /proc/cgroups:'; cat /proc/cgroups 2>&1 | head -20; echo '# kernel config:'; "
       "(grep -i -E 'CONFIG_CGROUP_DMEM|CONFIG_DRM' /boot/config-$(uname -r) 2>/dev/null || "
       "zcat /proc/config.gz 2>/dev/null | grep -i -E 'CONFIG_CGROUP_DMEM') | head -5", 10)

    log("--- A4: NVML library and the per-container memory-limit API")
    sh("ldconfig_nvml", "ldconfig -p | grep -i nvidia-ml", 10)
    path, why = nvml_path()
    d["libnvidia_ml_path"] = path
    d["libnvidia_ml_error"] = why
    log(f"libnvidia-ml.so.1 resolves to: {path or why}")
    d["nvml_memlimit_symbols_nm"] = None
    d["nvml_memlimit_symbols_scan"] = None
    d["nvml_limit_symbols"] = None
    if path:
        real = os.path.realpath(path)
        log(f"  realpath: {real}")
        d["libnvidia_ml_realpath"] = real
        if shutil.which("nm"):
            rc, out = sh("nm_memlimit", f"nm -D '{real}' | grep -i -E 'MemoryLimit|memlimit|MemLimit'", 20)
            d["nvml_memlimit_symbols_nm"] = [l.split()[-1] for l in out.splitlines() if l.strip() and "[" not in l]
        else:
            log("  nm: not installed (binutils); using a byte scan of the library instead")
        try:
            with open(real, "rb") as f:
                data = f.read()
            syms = sorted(set(s.decode() for s in re.findall(rb"nvml[A-Za-z0-9_]+", data)))
            d["nvml_symbol_count_scan"] = len(syms)
            d["nvml_memlimit_symbols_scan"] = [s for s in syms if re.search(r"(?i)memlimit|memorylimit", s)]
            d["nvml_limit_symbols"] = [s for s in syms if "Limit" in s][:80]
            log(f"  byte scan: {len(syms)} nvml* names; MemoryLimit/memlimit: {d['nvml_memlimit_symbols_scan']}")
            log(f"  all names with 'Limit': {d['nvml_limit_symbols']}")
        except OSError as e:
            log(f"  cannot read {real}: {e}")
        try:
            lib = ctypes.CDLL(path)
            cands = ["nvmlDeviceSetMemoryLimits_v1", "nvmlDeviceSetMemoryLimits", "nvmlDeviceGetMemoryLimits",
                     "nvmlDeviceGetMemoryLimits_v1", "nvmlDeviceSetMemoryLimit", "nvmlDeviceGetMemoryLimit",
                     "nvmlDeviceGetMemoryInfo_v2", "nvmlSystemGetDriverVersion"]
            d["nvml_dlsym"] = {c: hasattr(lib, c) for c in cands}
            log(f"  dlsym: {d['nvml_dlsym']}")
        except OSError as e:
            d["nvml_dlsym"] = f"cannot load: {e}"
    syms = (d["nvml_memlimit_symbols_nm"] or []) + (d["nvml_memlimit_symbols_scan"] or [])
    d["nvml_has_memlimit_api"] = bool(syms) if path else None

    log("--- A5: pynvml")
    code = r"""
import json, pynvml as n
n.nvmlInit()
s = lambda x: x.decode() if isinstance(x, bytes) else x
o = {"driver": s(n.nvmlSystemGetDriverVersion()), "nvml": s(n.nvmlSystemGetNVMLVersion())}
try: o["cuda_driver_version"] = n.nvmlSystemGetCudaDriverVersion_v2()
except Exception as e: o["cuda_driver_version"] = str(e)
o["count"] = n.nvmlDeviceGetCount(); o["gpus"] = []
for i in range(o["count"]):
    h = n.nvmlDeviceGetHandleByIndex(i); g = {"name": s(n.nvmlDeviceGetName(h)), "uuid": s(n.nvmlDeviceGetUUID(h))}
    m = n.nvmlDeviceGetMemoryInfo(h); g["memory_total_gib"] = round(m.total / 2**30, 2)
    for k, f in [("mig_mode", lambda: n.nvmlDeviceGetMigMode(h)), ("compute_mode", lambda: n.nvmlDeviceGetComputeMode(h)),
                 ("persistence", lambda: n.nvmlDeviceGetPersistenceMode(h))]:
        try: g[k] = f()
        except Exception as e: g[k] = "err: " + str(e)
    o["gpus"].append(g)
print(json.dumps(o))
"""
    try:
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
        d["pynvml"] = json.loads(p.stdout.strip().splitlines()[-1]) if p.returncode == 0 else \
            {"error": (p.stderr.strip() or p.stdout.strip())[-800:]}
    except (subprocess.TimeoutExpired, ValueError, IndexError) as e:
        d["pynvml"] = {"error": str(e)}
    log(f"  {json.dumps(d['pynvml'])}")

    log("--- A6: NVIDIA Container Toolkit and MPS binaries")
    for tool in ["nvidia-ctk", "nvidia-container-cli", "nvidia-container-runtime"]:
        paths = which_in(tool, ["/usr/bin", "/usr/local/bin", "/usr/local/nvidia/toolkit"])
        if paths:
            rc, out = sh(f"{tool}_version", f"'{paths[0]}' --version 2>&1 | head -5", 10)
            d[tool] = {"path": paths[0], "version": out}
        else:
            d[tool] = "absent"
            log(f"{tool}: absent")
    for tool in ["nvidia-cuda-mps-control", "nvidia-cuda-mps-server"]:
        paths = which_in(tool, MPS_DIRS)
        d[tool] = paths or "absent"
        log(f"{tool}: {paths or 'ABSENT (looked on PATH, ' + ', '.join(MPS_DIRS) + ', /usr/local/cuda-*/bin)'}")
    sh("preexisting_mps", "ls -la /tmp/nvidia-mps /var/log/nvidia-mps 2>&1 | head; "
       "for p in /proc/[0-9]*; do c=$(cat $p/comm 2>/dev/null); case \"$c\" in nvidia-cuda-mps*) "
       "echo \"running: ${p#/proc/} $c\";; esac; done", 10)

    d["complete"] = True
    log(f"facts: driver={d.get('driver_version')} cuda={d.get('cuda_version')} dmem={d['dmem_controller']} "
        f"nvml_memlimit_api={d['nvml_has_memlimit_api']} mps_control={d['nvidia-cuda-mps-control']}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    finally:
        if D.get("_json_out"):
            D["commands"] = RESULTS
            with open(D.pop("_json_out"), "w") as f:
                json.dump(D, f, indent=1, default=str)

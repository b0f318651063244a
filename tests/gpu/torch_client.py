#!/usr/bin/env python3
"""A CUDA client (PyTorch) for the MPS tests. One process, one JSON result line.

  --alloc 2,1,2     cumulative allocations in GiB (torch.empty(n, uint8, 'cuda')), stop at
                    the first failure, recording the exact exception text
  --matmul 3        bf16 8192^3 matmul loop for ~N seconds, TFLOP/s
  --hold 5          keep the allocations (and the CUDA context) this many seconds before exiting
  --smi             run nvidia-smi while holding (is this process listed? as an MPS client?)
Always reports torch.cuda.mem_get_info() (free, total as this client sees them) and the MPS env.
The last stdout line is `RESULT {json}`.
"""

import argparse
import json
import os
import subprocess
import sys
import time
import traceback

GIB = 1 << 30
T0 = time.time()
R = {"pid": os.getpid(), "label": None, "env": {k: v for k, v in os.environ.items()
                                                if k.startswith("CUDA_MPS") or k == "CUDA_VISIBLE_DEVICES"}}


def log(msg):
    print(f"[client {R['label']} pid {os.getpid()} +{time.time() - T0:5.1f}s] {msg}", flush=True)


def finish(code=0):
    R["wall_s"] = round(time.time() - T0, 2)
    print("RESULT " + json.dumps(R), flush=True)
    sys.stdout.flush()
    os._exit(code)  # no teardown surprises (an MPS client at exit can hang)


def err_text(e):
    s = f"{type(e).__name__}: {e}"
    return s[:1500]


def mem_info(torch):
    f, t = torch.cuda.mem_get_info()
    return {"free_gib": round(f / GIB, 3), "total_gib": round(t / GIB, 3), "free": f, "total": t}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--label", default="client")
    ap.add_argument("--alloc", default="")
    ap.add_argument("--matmul", type=float, default=0.0)
    ap.add_argument("--hold", type=float, default=0.0)
    ap.add_argument("--smi", action="store_true")
    a = ap.parse_args()
    R["label"] = a.label
    try:
        import torch
    except Exception as e:  # noqa: BLE001
        R["stage"] = "import"
        R["error"] = err_text(e)
        log(f"cannot import torch: {R['error']}")
        finish(2)
    R["torch"] = torch.__version__
    R["t_import_s"] = round(time.time() - T0, 2)
    try:
        t = time.time()
        torch.cuda.init()
        R["device_count"] = torch.cuda.device_count()
        R["device_name"] = torch.cuda.get_device_name(0)
        R["mem_get_info_start"] = mem_info(torch)
        R["t_cuda_init_s"] = round(time.time() - t, 2)
        log(f"torch {torch.__version__}, {R['device_name']}, mem_get_info free "
            f"{R['mem_get_info_start']['free_gib']} GiB / total {R['mem_get_info_start']['total_gib']} GiB "
            f"(env {R['env']})")
    except Exception as e:  # noqa: BLE001
        R["stage"] = "cuda_init"
        R["error"] = err_text(e)
        log(f"CUDA init failed: {R['error']}")
        finish(3)

    held = []
    if a.alloc:
        sizes = [float(x) for x in a.alloc.split(",") if x.strip()]
        R["alloc"] = []
        cum = 0.0
        for s in sizes:
            step = {"gib": s, "cumulative_gib": cum + s}
            try:
                x = torch.empty(int(s * GIB), dtype=torch.uint8, device="cuda")
                torch.cuda.synchronize()
                held.append(x)
                cum += s
                step["ok"] = True
            except Exception as e:  # noqa: BLE001
                step["ok"] = False
                step["error"] = err_text(e)
            try:
                step["mem_get_info_after"] = mem_info(torch)
            except Exception as e:  # noqa: BLE001
                step["mem_get_info_after"] = err_text(e)
            R["alloc"].append(step)
            log(f"alloc {s} GiB (cumulative {step['cumulative_gib']}): "
                f"{'OK' if step['ok'] else 'FAILED: ' + step['error']}")
            if not step["ok"]:
                break
        R["held_gib"] = cum
        R["first_failure_cumulative_gib"] = next(
            (st["cumulative_gib"] for st in R["alloc"] if not st["ok"]), None)

    if a.matmul > 0:
        try:
            n = 8192
            x = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
            y = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
            for _ in range(3):
                z = x @ y
            torch.cuda.synchronize()
            iters, t = 0, time.time()
            while time.time() - t < a.matmul:
                for _ in range(10):
                    z = x @ y
                torch.cuda.synchronize()
                iters += 10
            dt = time.time() - t
            R["matmul"] = {"n": n, "iters": iters, "seconds": round(dt, 3),
                           "tflops": round(iters * 2 * n ** 3 / dt / 1e12, 1)}
            del z
            log(f"matmul bf16 {n}^3: {R['matmul']['tflops']} TFLOP/s ({iters} iters in {dt:.2f}s)")
        except Exception as e:  # noqa: BLE001
            R["matmul"] = {"error": err_text(e)}
            log(f"matmul failed: {R['matmul']['error']}")

    if a.smi:
        try:
            p = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=15)
            lines = p.stdout.splitlines()
            i = next((k for k, l in enumerate(lines) if "Processes:" in l), None)
            table = lines[i:] if i is not None else lines[-12:]
            R["smi_processes"] = table[:20]
            mine = [l for l in table if f" {os.getpid()} " in l]
            R["smi_self_rows"] = mine
            R["smi_self_is_mps_client"] = any("M+C" in l for l in mine) if mine else None
            R["smi_mps_server_listed"] = any("mps-server" in l for l in table)
            log("nvidia-smi processes:\n" + "\n".join("    " + l for l in table[:20]))
        except Exception as e:  # noqa: BLE001
            R["smi_error"] = err_text(e)

    if a.hold > 0:
        time.sleep(a.hold)
        try:
            R["mem_get_info_end"] = mem_info(torch)
        except Exception as e:  # noqa: BLE001
            R["mem_get_info_end"] = err_text(e)
    R["ok"] = True
    finish(0)


if __name__ == "__main__":
    try:
        main()
    except SystemExit:
        raise
    except BaseException as e:  # noqa: BLE001
        R["error"] = err_text(e)
        R["traceback"] = traceback.format_exc()[-2000:]
        finish(4)

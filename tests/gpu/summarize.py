#!/usr/bin/env python3
"""Merges the parts' JSON into gpu-results.json, with a headline of the answers that matter."""

import json
import sys
import time


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        return {"missing": f"{path}: {e}"}


def g(d, *keys):
    for k in keys:
        if not isinstance(d, dict):
            return None
        d = d.get(k)
    return d


def main():
    work, out, started = sys.argv[1], sys.argv[2], float(sys.argv[3])
    a, b, c = load(f"{work}/a.json"), load(f"{work}/b.json"), load(f"{work}/c.json")
    steps = {}
    try:
        for line in open(f"{work}/steps.txt"):
            name, rc, secs = line.split()
            steps[name] = {"rc": None if rc == "x" else int(rc), "seconds": int(secs),
                           "timed_out": rc in ("124", "137")}
    except OSError:
        pass
    gpus = g(a, "pynvml", "gpus") or []
    tests = g(c, "tests") or {}

    def t(name, key):
        return g(tests, name, "summary", key)

    headline = {
        "gpu": gpus[0].get("name") if gpus else None,
        "gpu_count": g(a, "pynvml", "count"),
        "driver": a.get("driver_version"),
        "cuda": a.get("cuda_version"),
        "mig_mode": gpus[0].get("mig_mode") if gpus else None,
        "compute_mode": gpus[0].get("compute_mode") if gpus else None,
        "dmem_cgroup_controller": a.get("dmem_controller"),
        "cgroup_v2_root": a.get("cgroup_v2_root"),
        "nvml_memlimit_api": a.get("nvml_has_memlimit_api"),
        "nvml_memlimit_symbols": sorted(set((a.get("nvml_memlimit_symbols_nm") or [])
                                            + (a.get("nvml_memlimit_symbols_scan") or []))),
        "nvidia_ctk": a.get("nvidia-ctk") if isinstance(a.get("nvidia-ctk"), str) else g(a, "nvidia-ctk", "version"),
        "nvidia_container_cli": a.get("nvidia-container-cli") if isinstance(a.get("nvidia-container-cli"), str)
        else g(a, "nvidia-container-cli", "version"),
        "mps_control": g(c, "binaries", "nvidia-cuda-mps-control") or a.get("nvidia-cuda-mps-control"),
        "B_reserve_ok": b.get("ok"),
        "B_real_case_ok": g(b, "cases", "real", "ok"),
        "B_failure_path_ok": g(b, "cases", "absent-lib", "ok"),
        "B_agent_uuid": b.get("agent_uuid"),
        "B_matches_nvidia_smi": b.get("matches_nvidia_smi"),
        "B_matches_pynvml": b.get("matches_pynvml"),
        "B_exit_code_after_sigterm": g(b, "cases", "real", "exit_code"),
        "C_daemon_started": g(c, "daemon_start_1", "ok"),
        "C_daemon_start_error": None if g(c, "daemon_start_1", "ok") else g(c, "daemon_start_1"),
        "C1_no_mps_held_gib": t("C1", "held_gib"),
        "C2_env4G_total_seen_gib": t("C2", "total_gib_seen"),
        "C2_env4G_first_failure_at_gib": t("C2", "first_failure_cumulative_gib"),
        "C2_failure_text": t("C2", "failure_text"),
        "C2_is_mps_client_per_smi": t("C2", "smi_self_is_mps_client"),
        "C3_default3G_total_seen_gib": t("C3", "total_gib_seen"),
        "C3_default3G_first_failure_at_gib": t("C3", "first_failure_cumulative_gib"),
        "C4_env8G_over_default3G": t("C4", "verdict"),
        "C5_tflops": g(c, "C5_tflops"),
        "C6a_dead_pipe_dir": t("C6a", "verdict"),
        "C6b_never_existed_pipe_dir": t("C6b", "verdict"),
        "C7": g(c, "C7_verdict"),
        "C_skipped": g(c, "skipped"),
        "C_aborted": g(c, "aborted"),
    }
    res = {"headline": headline, "steps": steps, "wall_s": round(time.time() - started, 1),
           "A_facts": a, "B_reserve": b, "C_mps": c}
    with open(out, "w") as f:
        json.dump(res, f, indent=1, default=str)
    print(json.dumps(headline, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())

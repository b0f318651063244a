#!/usr/bin/env python3
"""gpu-share against FGD on every workload variant: the nine shared traces and the generated ones.

    python3 benches/variants.py                  # seeds 42..51; gpu-share on PATH, else target/release
    python3 benches/variants.py --seeds 1..10 --out benches/results/variants-seeds1-10

For each variant, `gpu-share simulate` replays the gpu-share and fgd policies (tune 1.3) and this
writes a markdown table and a JSON file (default benches/results/variants.md and .json): GPUs left
unallocated at 100% and 130% arrival, mean over the seeds, and gpu-share's margin against the FGD
reference, the lower of the project's FGD and the published figure where one exists (the paper's
sensitivity figures, at 100% arrival only; reference/fgd.md section 5). Negative margins are
gpu-share ahead.

The variants, fixed before any tuning (docs/packing.md, "Variants"):
  - the nine traces of ../shared/data/openb: default, gpushare40/60/80/100, multigpu20/30/40/50;
  - pin-one-5/10/20/33: that share of the GPU pods pinned to the most common GPU model;
  - pin-sets-5/10/20/33: that share pinned to pairs of models, drawn by the pair's GPUs;
  - cpu-x0, cpu-x0.5, cpu-x2, cpu-x3: the default trace's CPU-only pods 0 to 3 times over.
The generated variants are drawn from the default trace with --variant-seed 2023.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "..", "shared", "data", "openb")

SHARED = ["default", "gpushare40", "gpushare60", "gpushare80", "gpushare100",
          "multigpu20", "multigpu30", "multigpu40", "multigpu50"]
GENERATED = ([f"pin-one-{p}" for p in (5, 10, 20, 33)]
             + [f"pin-sets-{p}" for p in (5, 10, 20, 33)]
             + ["cpu-x0", "cpu-x0.5", "cpu-x2", "cpu-x3"])

# FGD's unallocated GPU % at 100% arrival, mean of 10 seeds, as published (reference/fgd.md).
PUBLISHED_FGD_100 = {
    "default": 4.77, "gpushare40": 6.0, "gpushare60": 8.8, "gpushare80": 10.9,
    "gpushare100": 13.4, "multigpu20": 4.5, "multigpu30": 3.6, "multigpu40": 3.1,
    "multigpu50": 2.9,
}


def run(binary, variant, seeds, threads):
    trace = variant if variant in SHARED else "default"
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "report.json")
        cmd = [binary, "simulate",
               "--nodes", os.path.join(DATA, "openb_node_list_gpu_node.csv"),
               "--pods", os.path.join(DATA, f"openb_pod_list_{trace}.csv"),
               "--policy", "fgd", "--policy", "gpu-share",
               "--seeds", seeds, "--json", out]
        if threads:
            cmd += ["--threads", str(threads)]
        if variant not in SHARED:
            cmd += ["--variant", variant]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with open(out) as f:
            report = json.load(f)
    by = {p["name"]: p for p in report["policies"]}
    row = {"variant": variant, "pods": report["pods"]}
    for at in ("100", "130"):
        fgd = by["fgd"]["unallocated_gpu_pct"][at]
        gs = by["gpu-share"]["unallocated_gpu_pct"][at]
        ref = fgd
        if at == "100" and variant in PUBLISHED_FGD_100:
            ref = min(fgd, PUBLISHED_FGD_100[variant])
        row[at] = {"gpuShare": round(gs, 2), "fgd": round(fgd, 2), "reference": round(ref, 2),
                   "margin": round(gs - ref, 2)}
    return row


def budget_lines(path):
    """The decision budget beside the table: filter and prioritize server-side p99 over the runs
    of a benches/run.sh JSON (5,000 nodes with a full ledger; the goal is 2 ms each)."""
    if not path or not os.path.exists(path):
        return []
    with open(path) as f:
        wire = json.load(f)
    meta = wire["meta"]
    parts = []
    for verb in ("filter", "prioritize"):
        p99 = sorted(r["server_p99_ms"] for r in wire["rows"]
                     if r["name"] == verb and r["target"] == "gpu-share")
        if not p99:
            return []
        parts.append(f"{verb} {p99[len(p99) // 2]:.2f} ms ({p99[0]:.2f}-{p99[-1]:.2f})")
    return ["", f"Decision budget with this policy (`benches/run.sh`, {meta['machine']}): server-side "
            f"p99 over {meta['nodes']:,} nodes holding {wire['fill']['bound']:,} pods, median of "
            f"{meta['runs']} runs (range): " + ", ".join(parts) + "; the goal is 2 ms each. "
            f"From `{os.path.relpath(path, ROOT)}`."]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # The gpu-share on PATH (`cargo install --path .`, or the README check's build), else the
    # checkout's release build.
    ap.add_argument("--binary", default=shutil.which("gpu-share")
                    or os.path.join(ROOT, "target", "release", "gpu-share"))
    ap.add_argument("--seeds", default="42..51")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--out", default=os.path.join(ROOT, "benches", "results", "variants"))
    ap.add_argument("--only", nargs="*", help="just these variants")
    ap.add_argument("--budget", default=os.path.join(ROOT, "benches", "results", "budget.json"),
                    help="a benches/run.sh JSON whose filter and prioritize figures go under the "
                         "table (written by: OUT=benches/results/budget bash benches/run.sh)")
    args = ap.parse_args()
    variants = args.only or SHARED + GENERATED
    rows = []
    for v in variants:
        rows.append(run(args.binary, v, args.seeds, args.threads))
        r = rows[-1]
        print(f"{v:14} 100%: {r['100']['gpuShare']:6.2f} vs {r['100']['reference']:6.2f} "
              f"({r['100']['margin']:+.2f})   130%: {r['130']['gpuShare']:6.2f} vs "
              f"{r['130']['reference']:6.2f} ({r['130']['margin']:+.2f})", file=sys.stderr)
    ahead = sum(1 for r in rows if r["100"]["margin"] < 0 and r["130"]["margin"] < 0)
    lines = [
        f"Unallocated GPU % (mean of seeds {args.seeds}, tune 1.3): gpu-share against the FGD "
        "reference (the lower of the project's FGD and the published figure, where one exists). "
        "Negative margins: gpu-share ahead.",
        "",
        "| variant | pods | gpu-share @100 | FGD ref @100 | margin | gpu-share @130 | FGD @130 | margin |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        a, b = r["100"], r["130"]
        lines.append(f"| {r['variant']} | {r['pods']} | {a['gpuShare']:.2f} | {a['reference']:.2f} | "
                     f"{a['margin']:+.2f} | {b['gpuShare']:.2f} | {b['reference']:.2f} | "
                     f"{b['margin']:+.2f} |")
    lines += ["", f"gpu-share ahead at both arrival levels on {ahead} of {len(rows)} variants."]
    lines += budget_lines(args.budget)
    with open(args.out + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(args.out + ".json", "w") as f:
        json.dump({"seeds": args.seeds, "variants": rows}, f, indent=2)
        f.write("\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

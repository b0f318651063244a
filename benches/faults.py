#!/usr/bin/env python3
"""The fault runner's long run: tests/chaos.rs for an hour with a random seed.

    python3 benches/faults.py [--seconds 3600] [--seed N] [--out benches/results/faults.json]

Runs `cargo test --test chaos -- --ignored` with GPU_SHARE_CHAOS_SECONDS (rounds of every fault,
in a seeded order, until the time is up), GPU_SHARE_CHAOS_SEED (random unless given: the seed is
printed first, and the report keeps it, so any run can be replayed) and GPU_SHARE_CHAOS_REPORT.
It needs what CI's fault stage needs: Go (the control plane is built from its modules), root
(each scheduler replica gets a hostname of its own with unshare), and about 2 GiB of memory.

Prints a summary of the report (faults injected by kind, invariant checks, failover and
handover times, pod waits, drift repaired, processes that exited by themselves, violations) and
exits with the test's status. docs/operations.md quotes the last run.
"""
import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def spread(values):
    if not values:
        return "none"
    values = sorted(values)
    return (
        f"n={len(values)} median {statistics.median(values):.1f} s, "
        f"min {values[0]:.1f} s, max {values[-1]:.1f} s"
    )


def summary(r):
    lines = [
        f"seed {r['seed']}: {r['seconds']} s, {r['faults_injected']} faults injected",
        f"invariant checks: capacity and admission every second: {r['checks']['capacity_checks']}; "
        f"after each fault, ledgers = API, pods accounted for, reservations = shares: "
        f"{r['checks']['settled_checks']} (slowest to settle {r['checks']['settle_s_max']:.1f} s)",
        f"violations: {len(r['violations'])}",
    ]
    for v in r["violations"]:
        lines.append(f"  {v}")
    lines.append("faults:")
    for kind, runs in r["faults"].items():
        lines.append(f"  {kind}: {len(runs)}")
        keys = sorted({k for run in runs for k in run["measures"]})
        for k in keys:
            vals = [run["measures"][k] for run in runs if k in run["measures"]]
            if k.endswith("_s"):
                lines.append(f"    {k}: {spread(vals)}")
            else:
                lines.append(f"    {k}: total {sum(vals):.0f}")
    p = r["pods"]
    lines.append(
        f"pods bound: {p['bound']}; wait p50 {p['wait_s_p50']:.0f} s, p95 {p['wait_s_p95']:.0f} s, "
        f"max {p['wait_s_max']:.0f} s; over 5 s: {p['waited_over_5s']}, over 30 s: "
        f"{p['waited_over_30s']}; deleted before bound: {p['deleted_before_bound']}; "
        f"pending at the end: {p['pending_at_end']}"
    )
    lines.append(f"drift repaired by reconcile: {r['drift']}")
    lines.append(f"churn: {r['churn']}")
    lines.append(f"processes that exited by themselves: {len(r['unexpected_exits'])}")
    # "NAME at T s: LOG | LOG | LOG": grouped by process and the first words of why.
    groups = {}
    for e in r["unexpected_exits"]:
        name, _, rest = e.partition(" at ")
        why = rest.split(": ", 1)[-1]
        for key in ("Leaderelection lost", "leaderelection lost", "command failed"):
            if key in why:
                why = key
                break
        else:
            why = why[:80]
        groups[(name, why)] = groups.get((name, why), 0) + 1
    for (name, why), n in sorted(groups.items()):
        lines.append(f"  {name}: {n} x {why}")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=int, default=3600)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--out", default=os.path.join(ROOT, "benches/results/faults.json"))
    a = ap.parse_args()
    seed = a.seed if a.seed is not None else random.SystemRandom().randrange(2**63)
    print(f"faults.py: seed {seed}, {a.seconds} s", flush=True)
    env = dict(
        os.environ,
        GPU_SHARE_CHAOS_SEED=str(seed),
        GPU_SHARE_CHAOS_SECONDS=str(a.seconds),
        GPU_SHARE_CHAOS_REPORT=os.path.abspath(a.out),
    )
    start = time.time()
    rc = subprocess.call(
        ["cargo", "test", "--locked", "--test", "chaos", "--", "--ignored", "--nocapture"],
        cwd=ROOT,
        env=env,
    )
    print(f"faults.py: the run took {time.time() - start:.0f} s, exit {rc}", flush=True)
    if os.path.exists(a.out):
        with open(a.out) as f:
            print(summary(json.load(f)))
    else:
        print(f"faults.py: no report at {a.out}", file=sys.stderr)
    sys.exit(rc)


if __name__ == "__main__":
    main()

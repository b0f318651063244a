#!/usr/bin/env bash
# gpu-share over the wire, against a floor: every figure of docs/performance.md's "Over the wire" table.
#
#   bash benches/run.sh                 # 3 runs, writes benches/results/wire.md and .json
#   RUNS=5 PODS=150000 bash benches/run.sh
#
# What it does, all over TLS on loopback, with the release build:
#   1. Webhook. `gpu-share serve --dev --role webhook` and the floor (benches/floor.rs: the same
#      axum + hyper + rustls stack answering a constant) each get apiserver-shaped AdmissionReviews
#      (tests/fixtures/admission: MIG, MPS with memory, time-slicing with affinity, exclusive, and a
#      pod without the annotation), round-robin over 8 HTTP/2 connections:
#        - at a fixed 2,000 per second for 20 s (after 2 s of warm-up), latency counted from each
#          request's slot in the schedule;
#        - back to back on 8 connections for 10 s: the most each answers.
#   2. Extender. `gpu-share serve --dev --role extender` with 5,000 GPU nodes of mixed kinds (8 GPUs
#      each), filled through the wire (filter, then bind) with up to PODS pods. Then kube-scheduler's
#      calls: filter and prioritize with all 5,000 names, one at a time on one kept-alive HTTP/2
#      connection, each for a new pod; the floor answers a reply as large. Client-side latency, and
#      the service's own time from its Server-Timing header.
#   3. RSS of the extender empty and full.
# Each measurement runs RUNS times, alternating gpu-share and the floor; the table gives the median
# and the range over the runs. The two processes share this machine's cores with the load
# generator (a single-threaded client), as they would not in a cluster.
set -euo pipefail
cd "$(dirname "$0")/.."

RUNS=${RUNS:-3}
PODS=${PODS:-150000}
NODES=${NODES:-5000}
RATE=${RATE:-2000}
OUT=${OUT:-benches/results/wire}

export GOTOOLCHAIN=local
say() { printf 'run.sh [%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

say "building (release): gpu-share, the load generator, the floor"
cargo build --release --quiet --bin gpu-share --example load --example floor
bin=target/release/gpu-share
load=target/release/examples/load
floor=target/release/examples/floor

work="$(mktemp -d)"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_ready() { # url
  for _ in $(seq 1 200); do
    curl -sfk -o /dev/null "$1" && return 0
    sleep 0.1
  done
  echo "run.sh: $1 never answered" >&2
  exit 1
}
rss_mib() { awk '/VmRSS/ {printf "%.0f", $2/1024}' "/proc/$1/status"; }

# ---- machine -------------------------------------------------------------------------------------
cpu="$(lscpu 2>/dev/null | awk -F: '/Model name/ {gsub(/^ +/, "", $2); print $2; exit}')"
machine="${cpu:-unknown CPU}, $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(uname -sr)"
say "machine: $machine"
echo "{\"machine\": \"$machine\", \"runs\": $RUNS, \"rate\": $RATE, \"nodes\": $NODES, \"pods\": $PODS}" >"$work/meta.json"

# ---- 1. webhook ----------------------------------------------------------------------------------
bodies=()
for f in mig-mixed mps-memory-sidecar timeslice-affinity exclusive-init no-annotation; do
  bodies+=(--body "tests/fixtures/admission/$f.json")
done
wport=$(free_port) wadmin=$(free_port) fport=$(free_port)
RUST_LOG=warn "$bin" serve --dev --role webhook --listen "127.0.0.1:$wport" --admin-listen "127.0.0.1:$wadmin" \
  2>"$work/webhook.log" &
pids+=($!)
"$floor" --listen "127.0.0.1:$fport" 2>"$work/floor.log" &
pids+=($!)
wait_ready "http://127.0.0.1:$wadmin/readyz"
sleep 0.5

: >"$work/results.jsonl"
record() { # name target json
  python3 -c 'import json,sys; d=json.loads(sys.argv[3]); d["name"]=sys.argv[1]; d["target"]=sys.argv[2]; print(json.dumps(d))' \
    "$1" "$2" "$3" >>"$work/results.jsonl"
}
for run in $(seq 1 "$RUNS"); do
  for target in gpu-share floor; do
    port=$wport
    [[ $target == floor ]] && port=$fport
    say "webhook run $run/$RUNS, $target: $RATE/s for 20 s"
    record "mutate-rate" "$target" "$("$load" rate --url "https://127.0.0.1:$port/mutate" "${bodies[@]}" --rate "$RATE" --duration 20)"
    say "webhook run $run/$RUNS, $target: closed loop, 8 connections, 10 s"
    record "mutate-max" "$target" "$("$load" closed --url "https://127.0.0.1:$port/mutate" "${bodies[@]}" --connections 8 --duration 10)"
  done
done
kill "${pids[@]}" 2>/dev/null || true
wait 2>/dev/null || true
pids=()

# ---- 2. extender ---------------------------------------------------------------------------------
"$load" nodes --count "$NODES" --out "$work/nodes.json" >/dev/null
eport=$(free_port) eadmin=$(free_port) fport=$(free_port)
RUST_LOG=warn "$bin" serve --dev --role extender --nodes "$work/nodes.json" \
  --listen "127.0.0.1:$eport" --admin-listen "127.0.0.1:$eadmin" 2>"$work/extender.log" &
epid=$!
pids+=($epid)
"$floor" --listen "127.0.0.1:$fport" --nodes "$work/nodes.json" 2>"$work/floor.log" &
pids+=($!)
wait_ready "http://127.0.0.1:$eadmin/readyz"
sleep 1
empty_rss=$(rss_mib "$epid")
say "extender: $NODES nodes, RSS $empty_rss MiB; binding up to $PODS pods through the wire"
fill="$("$load" fill --url "https://127.0.0.1:$eport" --nodes "$work/nodes.json" --pods "$PODS" --connections 8)"
sleep 2
full_rss=$(rss_mib "$epid")
say "extender filled: $fill; RSS $full_rss MiB"
python3 -c 'import json,sys; d=json.loads(sys.argv[1]); d.update(empty_rss_mib=int(sys.argv[2]), full_rss_mib=int(sys.argv[3])); print(json.dumps(d))' \
  "$fill" "$empty_rss" "$full_rss" >"$work/fill.json"
for run in $(seq 1 "$RUNS"); do
  for verb in filter prioritize; do
    for target in gpu-share floor; do
      port=$eport
      [[ $target == floor ]] && port=$fport
      say "extender run $run/$RUNS, $verb, $target: 2,000 calls over $NODES names"
      record "$verb" "$target" "$("$load" extender --url "https://127.0.0.1:$port" --nodes "$work/nodes.json" --verb "$verb" --requests 2000)"
    done
  done
done
after_rss=$(rss_mib "$epid")

# ---- the table -----------------------------------------------------------------------------------
mkdir -p "$(dirname "$OUT")"
python3 - "$work" "$OUT" "$after_rss" <<'EOF'
import json, statistics, sys
work, out, after_rss = sys.argv[1], sys.argv[2], int(sys.argv[3])
meta = json.load(open(f"{work}/meta.json"))
fill = json.load(open(f"{work}/fill.json"))
rows = [json.loads(l) for l in open(f"{work}/results.jsonl")]

def runs(name, target, key):
    return [r[key] for r in rows if r["name"] == name and r["target"] == target and r.get(key) is not None]

def med(v):
    return statistics.median(v) if v else None

def cell(v, unit="ms"):
    if not v:
        return "-"
    m, lo, hi = med(v), min(v), max(v)
    fmt = (lambda x: f"{x:.2f}") if unit == "ms" else (lambda x: f"{x:,.0f}")
    return f"{fmt(m)} ({fmt(lo)}-{fmt(hi)})" if len(v) > 1 else fmt(m)

def ratio(name, key):
    a, b = med(runs(name, "gpu-share", key)), med(runs(name, "floor", key))
    return f"{a / b:.2f}" if a and b else "-"

errors = sum(r.get("errors", 0) for r in rows)
lines = []
lines.append(f"Machine: {meta['machine']}. {meta['runs']} runs; median (min-max). "
             f"Client-side latency over TLS on loopback, HTTP/2, with the load generator on the same cores.")
lines.append("")
lines.append("| | | p50 | p99 | p99.9 | throughput/s | server p50 | server p99 |")
lines.append("|---|---|---|---|---|---|---|---|")
for name, label in [("mutate-rate", f"/mutate at {meta['rate']:,}/s"), ("mutate-max", "/mutate, most per second (8 connections)"),
                    ("filter", f"filter, {meta['nodes']:,} names"), ("prioritize", f"prioritize, {meta['nodes']:,} names")]:
    for target in ("gpu-share", "floor"):
        lines.append(f"| {label} | {target} | {cell(runs(name, target, 'p50_ms'))} | {cell(runs(name, target, 'p99_ms'))} | "
                     f"{cell(runs(name, target, 'p999_ms'))} | {cell(runs(name, target, 'throughput'), '')} | "
                     f"{cell(runs(name, target, 'server_p50_ms'))} | {cell(runs(name, target, 'server_p99_ms'))} |")
    lines.append(f"| | ratio to the floor | {ratio(name, 'p50_ms')} | {ratio(name, 'p99_ms')} | {ratio(name, 'p999_ms')} | "
                 f"{ratio(name, 'throughput')} | | |")
lines.append("")
lines.append(f"Extender ledger: {meta['nodes']:,} nodes, {fill['bound']:,} pods bound through the wire in {fill['seconds']:.0f} s "
             f"({fill['binds_per_second']:,.0f} binds/s, a filter and a bind each; {fill['refused']:,} refused once the nodes were full). "
             f"RSS {fill['empty_rss_mib']} MiB empty, {fill['full_rss_mib']} MiB full, {after_rss} MiB after the timed calls.")
lines.append(f"Errors: {errors}.")
text = "\n".join(lines) + "\n"
open(f"{out}.md", "w").write(text)
json.dump({"meta": meta, "fill": fill, "after_rss_mib": after_rss, "rows": rows}, open(f"{out}.json", "w"), indent=1)
print(text)
EOF
say "wrote $OUT.md and $OUT.json"

#!/usr/bin/env bash
# The shoal-bench suite: ROUNDS rounds, each the machine's ceilings (../shared/bin/ceilings) and
# then the standard runs against a spawned server, so every figure has ceilings from the same
# round. Prints Markdown for docs/benchmarks.md: per-round figures, median ratios and targets.
# Run alone on an idle machine (nothing else building or running).
#   benches/suite.sh [ROUNDS] [SECONDS]        (default 3 rounds of 10 s runs)
# Runs (1,000-byte messages, 1,000 per batch unless noted; server 1 shard on CPU 0, bench on
# CPU 1, unless noted):
#   rep-large     replicated, 1 producer, 1 partition
#   per-large     persisted, same
#   rep-small     replicated, 100-byte messages
#   rep-4p        replicated, 4 producers on 4 partitions
#   rep-shared    replicated, 2 shards on CPUs 0,1 and 2 producers on CPUs 0,1 (2 + 2)
#   rep-half      replicated at 50% of rep-large's throughput (open loop): latency
#   per-half      persisted at 50% of per-large's throughput: latency
#   rtt           loopback round trip of a batch-sized request (the latency yardstick)
# and once, after the rounds:
#   tail          replicated, 100-message batches at 50% of rep-large's median throughput for
#                 TAIL_SECONDS (default 90; 0 skips it): >= 10^5 samples, so p99.99 can be quoted
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
seconds=${2:-10}
ceilings=${CEILINGS:-../shared/bin/ceilings}
out=target/bench-suite
mkdir -p "$out"
cargo build --release -p shoal-server -p shoal-bench >/dev/null 2>&1
bench=target/release/shoal-bench
one=configs/bench-1-shard.toml
two=configs/bench-2-shards.toml
run() { # NAME CONFIG ARGS...
  local name=$1 config=$2; shift 2
  "$bench" produce --spawn-server "$config" --warmup 2 --duration "$seconds" --quiet \
    --json "$out/$name-$round.json" "$@" > "$out/$name-$round.txt"
}
mbps() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['throughput_mb_s'])" "$1"; }
half() { python3 -c "import sys; print(f'{float(sys.argv[1]) / 2:.1f}MB/s')" "$1"; }
for round in $(seq 1 "$rounds"); do
  "$ceilings" "$(mktemp -d)" 10 | tail -n 1 > "$out/ceilings-$round.json"
  run rep-large "$one" --cpus 1 --durability replicated
  run per-large "$one" --cpus 1 --durability persisted
  run rep-small "$one" --cpus 1 --durability replicated --message-size 100
  run rep-4p "$one" --cpus 1 --producers 4 --durability replicated
  run rep-shared "$two" --cpus 0,1 --producers 2 --durability replicated
  run rep-half "$one" --cpus 1 --durability replicated --rate "$(half "$(mbps "$out/rep-large-$round.json")")"
  run per-half "$one" --cpus 1 --durability persisted --rate "$(half "$(mbps "$out/per-large-$round.json")")"
  batch=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['parameters']['batch_payload_bytes'])" "$out/rep-large-$round.json")
  "$bench" loopback --size "$batch" --samples 2000 --cpus 0,1 > "$out/rtt-$round.json"
done
tail_seconds=${TAIL_SECONDS:-90}
if [ "$tail_seconds" -gt 0 ]; then
  rate=$(python3 -c 'import json, statistics, sys
print("%.1fMB/s" % (statistics.median(json.load(open(f))["throughput_mb_s"] for f in sys.argv[1:]) / 2))' "$out"/rep-large-*.json)
  "$bench" produce --spawn-server "$one" --warmup 2 --duration "$tail_seconds" --quiet \
    --json "$out/tail.json" --cpus 1 --durability replicated --messages-per-batch 100 \
    --rate "$rate" > "$out/tail.txt"
fi
python3 - "$out" "$rounds" <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
load = lambda name, r: json.load(open(f"{out}/{name}-{r}.json"))
runs = ["rep-large", "per-large", "rep-small", "rep-4p", "rep-shared"]
print("| round | seq_write_direct MB/s | loopback_tcp MB/s | fdatasync_64k p99 µs | " + " | ".join(f"{n} MB/s" for n in runs) + " | rtt p99 µs | rep-half p99 µs | per-half p99 µs |")
print("|" + "---|" * (5 + len(runs) + 3))
ratios = {n: [] for n in runs}
lat = {"rep": [], "per": []}
for r in range(1, rounds + 1):
    c = load("ceilings", r)
    ceiling = min(c["seq_write_direct_mb_s"], c["loopback_tcp_mb_s"])
    cells = [str(r), f'{c["seq_write_direct_mb_s"]:.0f}', f'{c["loopback_tcp_mb_s"]:.0f}', f'{c["fdatasync_64k_p99_us"]:.0f}']
    for n in runs:
        mb = load(n, r)["throughput_mb_s"]
        ratios[n].append(mb / ceiling)
        cells.append(f"{mb:.0f} ({mb / ceiling:.2f})")
    rtt = load("rtt", r)["latency_us"]["p99"]
    rep = load("rep-half", r)["latency_us"]["p99"]
    per = load("per-half", r)["latency_us"]["p99"]
    lat["rep"].append(rep / (3 * rtt))
    lat["per"].append(per / (3 * (rtt + c["fdatasync_64k_p99_us"])))
    cells += [str(rtt), str(rep), str(per)]
    print("| " + " | ".join(cells) + " |")
print()
print("| figure | median | target |")
print("|---|---|---|")
print(f'| rep-large / min(seq_write_direct, loopback_tcp) | {statistics.median(ratios["rep-large"]):.2f} | ≥ 0.70 |')
print(f'| per-large / same ceiling | {statistics.median(ratios["per-large"]):.2f} | ≥ 0.50 |')
for n in ["rep-small", "rep-4p", "rep-shared"]:
    print(f"| {n} / same ceiling | {statistics.median(ratios[n]):.2f} | — |")
print(f'| rep-half p99 / (3 × rtt p99) | {statistics.median(lat["rep"]):.2f} | ≤ 1 |')
print(f'| per-half p99 / (3 × (rtt p99 + fdatasync_64k p99)) | {statistics.median(lat["per"]):.2f} | ≤ 1 |')
import os
if os.path.exists(f"{out}/tail.json"):
    t = json.load(open(f"{out}/tail.json"))
    l = t["latency_us"]
    samples = l.get("count") or l.get("samples") or 0
    quoted = "" if samples >= 100_000 else " (fewer than 10^5 samples: not quoted)"
    print(f'| tail p99.99 / p99 ({samples} samples, p99 {l["p99"]} µs, p99.99 {l["p9999"]} µs) | {l["p9999"] / l["p99"]:.1f}{quoted} | ≤ 10 |')
PY

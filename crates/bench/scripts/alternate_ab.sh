#!/usr/bin/env bash
# Requests per second of two kvgate builds, both running, loaded in turn: A B, B A, A B ...
# (alternating the order cancels the machine's drift between the two of a pair).
# Loopback only; needs wrk. Used in docs/benchmarks.md ("Instructions per request").
#
#   crates/bench/scripts/alternate_ab.sh BIN_A BIN_B SIM [PAIRS] [SECONDS]
#
# BIN_A, BIN_B: kvgate binaries (e.g. a build with crates/bench/scripts/inspection_off.patch
# applied as B); SIM: kvgate-sim, started with --fixed-response. Each gateway routes
# round robin to the one engine; each run is `wrk -t1 -c16` with a 91-byte chat completion.
# Prints each pair and the two means.
set -euo pipefail
a=$1 b=$2 sim=$3 pairs=${4:-10} secs=${5:-4}
dir=$(mktemp -d)
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
sp=$(port) pa=$(port) pb=$(port)
"$sim" --engines 1 --base-port "$sp" --fixed-response >"$dir/sim.log" 2>&1 & pids+=($!)
"$a" --port "$pa" --worker-urls "http://127.0.0.1:$sp" --policy round_robin --data-dir "$dir/a" --log-level warn >"$dir/a.log" 2>&1 & pids+=($!)
"$b" --port "$pb" --worker-urls "http://127.0.0.1:$sp" --policy round_robin --data-dir "$dir/b" --log-level warn >"$dir/b.log" 2>&1 & pids+=($!)
cat >"$dir/post.lua" <<'LUA'
wrk.method = "POST"
wrk.body = '{"model":"kvgate-sim-model","messages":[{"role":"user","content":"Hello!"}],"max_tokens":1}'
wrk.headers["Content-Type"] = "application/json"
LUA
for p in "$pa" "$pb"; do
  for _ in $(seq 100); do curl -sf "http://127.0.0.1:$p/readiness" >/dev/null && break; sleep 0.1; done
  wrk -t1 -c16 -d2s -s "$dir/post.lua" "http://127.0.0.1:$p/v1/chat/completions" >/dev/null
done
run() { wrk -t1 -c16 -d"${secs}s" -s "$dir/post.lua" "http://127.0.0.1:$1/v1/chat/completions" | awk '/Requests\/sec/ {print $2}'; }
sum_a=0 sum_b=0
for i in $(seq "$pairs"); do
  if (( i % 2 )); then ra=$(run "$pa"); rb=$(run "$pb"); else rb=$(run "$pb"); ra=$(run "$pa"); fi
  echo "pair $i: A $ra  B $rb"
  sum_a=$(awk -v s="$sum_a" -v r="$ra" 'BEGIN {print s + r}')
  sum_b=$(awk -v s="$sum_b" -v r="$rb" 'BEGIN {print s + r}')
done
awk -v a="$sum_a" -v b="$sum_b" -v n="$pairs" \
  'BEGIN {printf "mean A %.0f  B %.0f  A/B %.3f\n", a / n, b / n, a / b}'

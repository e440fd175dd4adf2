#!/usr/bin/env bash
# Requests per second and CPU time per request (all threads, from /proc/PID/task/*/schedstat)
# of two kvgate builds, both running, loaded in turn: A B, B A, A B ... (alternating the order
# cancels the machine's drift between the two of a pair).
# Loopback only; needs wrk. Used in docs/benchmarks.md ("Instructions per request").
#
#   crates/bench/scripts/alternate_ab.sh BIN_A BIN_B SIM [PAIRS] [SECONDS]
#
# BIN_A, BIN_B: kvgate binaries (e.g. a build with crates/bench/scripts/inspection_off.patch
# applied as B); SIM: kvgate-sim, started with --fixed-response. Each gateway routes
# round robin to the one engine; each run is `wrk -t1 -c16` with a 91-byte chat completion.
# Prints each pair and the two means. CPU per request resolves a 1-2 % difference that req/s,
# moved by the scheduler on a 2-core machine, does not.
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
cpu_ns() { cat /proc/"$1"/task/*/schedstat 2>/dev/null | awk '{s += $1} END {print s}'; }
# "req/s cpu_us_per_request" of one wrk run against port $1, gateway pid $2.
run() {
  local c0 c1 out
  c0=$(cpu_ns "$2")
  out=$(wrk -t1 -c16 -d"${secs}s" -s "$dir/post.lua" "http://127.0.0.1:$1/v1/chat/completions")
  c1=$(cpu_ns "$2")
  awk -v c0="$c0" -v c1="$c1" '/requests in/ {n = $1} /Requests\/sec/ {r = $2}
    END {printf "%s %.2f\n", r, (c1 - c0) / n / 1000}' <<<"$out"
}
ida=${pids[1]} idb=${pids[2]}
sum=(0 0 0 0)
for i in $(seq "$pairs"); do
  if (( i % 2 )); then ra=$(run "$pa" "$ida"); rb=$(run "$pb" "$idb"); else rb=$(run "$pb" "$idb"); ra=$(run "$pa" "$ida"); fi
  echo "pair $i: A ${ra% *} req/s ${ra#* } us/req  B ${rb% *} req/s ${rb#* } us/req"
  read -r -a sum <<<"$(awk -v a="$ra" -v b="$rb" -v s="${sum[*]}" 'BEGIN {
    split(a, x, " "); split(b, y, " "); split(s, t, " ");
    print t[1] + x[1], t[2] + x[2], t[3] + y[1], t[4] + y[2] }')"
done
awk -v s="${sum[*]}" -v n="$pairs" 'BEGIN { split(s, t, " ");
  printf "mean A %.0f req/s %.2f us/req  B %.0f req/s %.2f us/req  A/B req/s %.3f\n",
    t[1] / n, t[2] / n, t[3] / n, t[4] / n, t[1] / t[3] }'

#!/usr/bin/env bash
# CPU time (user + system, all threads) a process spends per request under wrk load:
# steadier than req/s on a shared VM. Loopback only; needs wrk.
#
#   crates/bench/scripts/cpu_per_request.sh PID PORT SCRIPT.lua [SECONDS] [PATH]
#
# PID: the server to account (kvgate, or an nginx worker); PORT: where wrk sends;
# SCRIPT.lua: a wrk script (kvgate-bench proxy writes one as bench-out/post.lua).
# Prints req/s, requests, CPU µs per request and whether any answer was not 2xx.
# Used in docs/benchmarks.md ("Where the bytes go").
set -euo pipefail
pid=$1 port=$2 lua=$3 secs=${4:-5} path=${5:-/v1/chat/completions}
ticks() { awk '{print $14 + $15}' "/proc/$pid/stat"; }
t0=$(ticks)
out=$(wrk -t1 -c16 -d"${secs}s" -s "$lua" "http://127.0.0.1:$port$path")
t1=$(ticks)
n=$(awk '/requests in/ {print $1}' <<<"$out")
rps=$(awk '/Requests\/sec/ {print $2}' <<<"$out")
non2xx=$(grep -c 'Non-2xx' <<<"$out" || true)
hz=$(getconf CLK_TCK)
echo "rps=$rps requests=$n cpu_us_per_request=$(( (t1 - t0) * 1000000 / hz / n )) non2xx_lines=$non2xx"

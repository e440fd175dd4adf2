#!/usr/bin/env bash
# CPU time (user + system, all threads) a process spends per request under wrk load:
# steadier than req/s on a shared VM. Loopback only; needs wrk.
#
#   crates/bench/scripts/cpu_per_request.sh PID PORT SCRIPT.lua [SECONDS] [PATH]
#
# PID: the server to account (kvgate, or an nginx worker); PORT: where wrk sends;
# SCRIPT.lua: a wrk script (kvgate-bench proxy writes one as bench-out/post.lua).
# Prints req/s, requests, CPU µs per request (and its user and system parts) and whether
# any answer was not 2xx.
# Used in docs/benchmarks.md ("Where the bytes go").
set -euo pipefail
pid=$1 port=$2 lua=$3 secs=${4:-5} path=${5:-/v1/chat/completions}
ticks() { awk '{print $14, $15}' "/proc/$pid/stat"; }
read -r u0 s0 < <(ticks)
out=$(wrk -t1 -c16 -d"${secs}s" -s "$lua" "http://127.0.0.1:$port$path")
read -r u1 s1 < <(ticks)
n=$(awk '/requests in/ {print $1}' <<<"$out")
rps=$(awk '/Requests\/sec/ {print $2}' <<<"$out")
non2xx=$(grep -c 'Non-2xx' <<<"$out" || true)
hz=$(getconf CLK_TCK)
us() { echo $(( $1 * 1000000 / hz / n )); }
echo "rps=$rps requests=$n cpu_us_per_request=$(us $(( u1 - u0 + s1 - s0 ))) user_us=$(us $(( u1 - u0 ))) system_us=$(us $(( s1 - s0 ))) non2xx_lines=$non2xx"

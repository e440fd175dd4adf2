#!/usr/bin/env bash
# A process's resident memory after each of N rounds of wrk load, to tell a plateau from
# growth. Loopback only; needs wrk.
#
#   crates/bench/scripts/rss_under_load.sh PID PORT SCRIPT.lua [ROUNDS] [SECONDS]
#
# With the unique post.lua that `kvgate-bench proxy --unique` writes, every request
# inserts into kvgate's prefix tree. Used in docs/benchmarks.md ("Unique prompts").
set -euo pipefail
pid=$1 port=$2 lua=$3 rounds=${4:-6} secs=${5:-8}
for _ in $(seq "$rounds"); do
  n=$(wrk -t1 -c16 -d"${secs}s" -s "$lua" "http://127.0.0.1:$port/v1/chat/completions" | awk '/requests in/ {print $1}')
  echo "requests=$n $(grep VmRSS "/proc/$pid/status" | tr -s ' \t' ' ')"
done

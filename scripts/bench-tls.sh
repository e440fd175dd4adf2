#!/usr/bin/env bash
# The proxy's cost with TLS: kvgate and nginx each in front of one fixed-response engine,
# plain and with TLS on both legs (the listener, and the engine behind an nginx that
# terminates TLS for it, with the test-only CA of tests/fixtures/tls). Loopback only; it
# stops by itself. Needs release builds of kvgate and kvgate-sim, nginx and wrk.
#
#   cargo build --release -p kvgate -p kvgate-engine-sim
#   scripts/bench-tls.sh [target/release] [seconds per run]
#
# Prints one markdown row per target: req/s at 64 connections (wrk -t1 -c64) and p50 / p99
# at one connection (wrk -t1 -c1), each the median of 3 runs.
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${1:-target/release}"
secs="${2:-10}"
fix="$PWD/tests/fixtures/tls"
for t in nginx wrk "$bin/kvgate" "$bin/kvgate-sim"; do
  command -v "$t" >/dev/null || { echo "missing: $t" >&2; exit 1; }
done
work="$(mktemp -d)"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_up() {
  for _ in $(seq 100); do curl -sk -o /dev/null "$1" && return 0; sleep 0.1; done
  echo "not up: $1" >&2
  tail -n 5 "$work"/*.log "$work"/*/error.log >&2 2>/dev/null || true
  exit 1
}

engine=$(free_port)
"$bin/kvgate-sim" --base-port "$engine" --fixed-response >"$work/sim.log" 2>&1 &
pids+=($!)
wait_up "http://127.0.0.1:$engine/health"

# nginx, `listen` and `location` given; one worker process, upstream keep-alive.
nginx_conf() {
  local name=$1 listen=$2 location=$3
  mkdir -p "$work/$name"
  cat >"$work/$name/nginx.conf" <<EOF
daemon off;
worker_processes 1;
error_log $work/$name/error.log warn;
pid $work/$name/nginx.pid;
events { worker_connections 1024; }
http {
  access_log off;
  client_body_buffer_size 64k;
  upstream engine { server 127.0.0.1:$engine; keepalive 64; }
  upstream engine_tls { server 127.0.0.1:${engine_tls:-1}; keepalive 64; }
  server {
    $listen
    ssl_certificate $fix/cert.pem;
    ssl_certificate_key $fix/key.pem;
    location / { $location }
  }
}
EOF
  nginx -p "$work/$name" -c "$work/$name/nginx.conf" &
  pids+=($!)
}

# The engine behind TLS: nginx terminates it in front of the plain engine.
engine_tls=$(free_port)
nginx_conf engine-tls "listen 127.0.0.1:$engine_tls ssl;" \
  "proxy_pass http://engine; proxy_http_version 1.1; proxy_set_header Connection \"\";"
wait_up "https://127.0.0.1:$engine_tls/health"

targets=()
# kvgate, plain both ways.
kp=$(free_port)
"$bin/kvgate" --port "$kp" --worker-urls "http://127.0.0.1:$engine" --policy round_robin \
  --data-dir "$work/kv-plain" --log-level warn --access-log off >"$work/kv-plain.log" 2>&1 &
pids+=($!)
wait_up "http://127.0.0.1:$kp/readiness"
targets+=("kvgate, plain|http://127.0.0.1:$kp")
# kvgate, TLS on the listener and to the engine.
kt=$(free_port)
"$bin/kvgate" --port "$kt" --worker-urls "https://127.0.0.1:$engine_tls" --policy round_robin \
  --worker-ca-cert "$fix/ca.pem" --tls-cert-path "$fix/cert.pem" --tls-key-path "$fix/key.pem" \
  --data-dir "$work/kv-tls" --log-level warn --access-log off >"$work/kv-tls.log" 2>&1 &
pids+=($!)
wait_up "https://127.0.0.1:$kt/readiness"
targets+=("kvgate, TLS both legs|https://127.0.0.1:$kt")
# nginx, plain both ways.
np=$(free_port)
nginx_conf nginx-plain "listen 127.0.0.1:$np;" \
  "proxy_pass http://engine; proxy_http_version 1.1; proxy_set_header Connection \"\";"
targets+=("nginx, plain|http://127.0.0.1:$np")
# nginx, TLS on the listener and to the engine (sessions reused, keep-alive).
nt=$(free_port)
nginx_conf nginx-tls "listen 127.0.0.1:$nt ssl;" \
  "proxy_pass https://engine_tls; proxy_http_version 1.1; proxy_set_header Connection \"\"; proxy_ssl_trusted_certificate $fix/ca.pem; proxy_ssl_verify on; proxy_ssl_name localhost; proxy_ssl_session_reuse on;"
targets+=("nginx, TLS both legs|https://127.0.0.1:$nt")

cat >"$work/post.lua" <<'EOF'
wrk.method = "POST"
wrk.body = '{"messages":[{"role":"user","content":"hello there, how are you today?"}],"max_tokens":1}'
wrk.headers["Content-Type"] = "application/json"
EOF

median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
# wrk's latency in ms from its text ("123.45us", "1.20ms").
ms() { awk '{v=$1; if (v ~ /us$/) {sub(/us$/,"",v); v/=1000} else if (v ~ /ms$/) {sub(/ms$/,"",v)} else if (v ~ /s$/) {sub(/s$/,"",v); v*=1000}; printf "%.3f\n", v}'; }

echo "| target | req/s (64 conns) | p50 ms (1 conn) | p99 ms (1 conn) |"
echo "|---|---|---|---|"
for t in "${targets[@]}"; do
  name="${t%%|*}"; url="${t#*|}/v1/chat/completions"
  wait_up "${t#*|}/health"
  rps=(); p50=(); p99=()
  for _ in 1 2 3; do
    out=$(wrk -t1 -c64 -d"${secs}s" -s "$work/post.lua" "$url" 2>&1) \
      || { echo "$name: wrk failed: $out" >&2; tail -n 5 "$work"/*/error.log >&2; exit 1; }
    if echo "$out" | grep -q "Non-2xx"; then echo "$name: error answers: $out" >&2; exit 1; fi
    rps+=("$(echo "$out" | awk '/Requests\/sec/ {print $2}')")
    out=$(wrk -t1 -c1 -d"${secs}s" --latency -s "$work/post.lua" "$url")
    p50+=("$(echo "$out" | awk '$1=="50%" {print $2}' | ms)")
    p99+=("$(echo "$out" | awk '$1=="99%" {print $2}' | ms)")
  done
  echo "| $name | $(printf '%s\n' "${rps[@]}" | median) | $(printf '%s\n' "${p50[@]}" | median) | $(printf '%s\n' "${p99[@]}" | median) |"
done

#!/usr/bin/env python3
"""Instructions per proxied request, counted by callgrind: repeatable where timings are not.

    python3 crates/bench/scripts/proxy_instructions.py [--requests N] [--nginx] [--top K]
        [--inclusive PATTERN ...] [--body-kib N] [--policy P] [--unique] [--keep DIR]
        BIN [BIN ...]

Starts one fixed-response simulated engine (target/release/kvgate-sim), then, one at a
time, each `kvgate` binary BIN (and with --nginx, nginx as a reverse proxy) under
`valgrind --tool=callgrind`. Each target gets 300 warm-up requests, then its counters are
zeroed, N small chat completions are sent on one keep-alive connection, and the counters
are dumped. Printed per target: instructions (Ir) per request; the same without memset
(actix-http's request parser zeroes a 3 KB header table on each of its six decode
attempts per request, done with `rep stosb`, which callgrind counts once per byte: 18k
"instructions" that take a fraction of a microsecond); malloc calls per request; and the
K functions with the most instructions of their own; with --inclusive, the instructions
per request of each function whose name contains PATTERN, callees included (the splits
in docs/benchmarks.md come from `--inclusive proxy_request --inclusive ContextFut
--inclusive new_request_id --inclusive parse_head ...`). Loopback only; needs valgrind (and
nginx for --nginx). With --body-kib N the user message is N KiB of text (the body of
`kvgate-bench proxy --body-kib N`), with --unique each request's text starts with its own
number, and the figures are also given per KiB of body; --keep DIR keeps the dumps (for
callgrind_annotate or a diff of two builds). Used in docs/benchmarks.md.
"""
import argparse
import collections
import http.client
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

BODY = (b'{"model":"kvgate-sim-model","messages":[{"role":"user","content":"Hello!"}],'
        b'"max_tokens":1}')
WARMUP = 300


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(port, path, deadline=60.0):
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", path)
            if c.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.3)
    sys.exit(f"nothing answered 200 on port {port}{path} within {deadline:.0f} s")


def body_of(kib, unique, i):
    """The request body: the small one, or a chat message of `kib` KiB of text."""
    if kib is None:
        return BODY
    words = b"the quick brown fox jumps over the lazy dog "
    text = (words * (kib * 1024 // len(words) + 1))[:kib * 1024]
    if unique:
        tag = b"%010d " % i
        text = tag + text[len(tag):]
    return (b'{"model":"kvgate-sim-model","messages":[{"role":"user","content":"' + text +
            b'"}],"max_tokens":1}')


SENT = [0]


def send(port, n, kib=None, unique=False):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    for _ in range(n):
        SENT[0] += 1
        c.request("POST", "/v1/chat/completions", body_of(kib, unique, SENT[0]),
                  {"Content-Type": "application/json"})
        r = c.getresponse()
        body = r.read()
        if r.status != 200:
            sys.exit(f"port {port} answered {r.status}: {body[:200]!r}")
    c.close()


def control(flag, pid):
    subprocess.run(["callgrind_control", flag, str(pid)], check=True, capture_output=True)


def summarise(path, n, top):
    """Self and inclusive cost per function and malloc calls, from an uncompressed dump."""
    own = collections.Counter()
    incl = collections.Counter()
    mallocs = 0
    fn = cfn = None
    call_line = False
    with open(path) as f:
        for line in f:
            line = line.rstrip("\n")
            if line.startswith("fn="):
                fn = line[3:]
            elif line.startswith("cfn="):
                cfn = line[4:]
            elif line.startswith("calls="):
                call_line = True
                if cfn == "malloc":
                    mallocs += int(line[6:].split()[0])
            elif line[:1].isdigit() or line[:1] in "+-*":
                # The cost line after `calls=` is the callee's inclusive cost.
                parts = line.split()
                if fn is not None and len(parts) >= 2:
                    incl[fn] += int(parts[1])
                    if not call_line:
                        own[fn] += int(parts[1])
                call_line = False
    total = sum(own.values())
    memset = sum(c for f, c in own.items() if "memset" in f)
    return total / n, (total - memset) / n, mallocs / n, own.most_common(top), incl


def profile(name, label, argv, port, ready_path, n, top, workdir, inclusive=(), kib=None,
            unique=False):
    out = os.path.join(workdir, f"{name}.out")
    cmd = ["valgrind", "--tool=callgrind", "--compress-strings=no", "--compress-pos=no",
           f"--callgrind-out-file={out}"] + argv
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ready(port, ready_path)
        warmup = WARMUP if kib is None else max(20, WARMUP // kib)
        send(port, warmup, kib, unique)
        control("-z", proc.pid)
        send(port, n, kib, unique)
        control("-d", proc.pid)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
    dumps = [f for f in os.listdir(workdir) if f.startswith(f"{name}.out.")]
    if len(dumps) != 1:
        sys.exit(f"{name}: expected one callgrind dump, found {dumps}")
    ir, ir_no_memset, mallocs, hot, incl = summarise(os.path.join(workdir, dumps[0]), n, top)
    print(f"{label}: {ir:,.0f} Ir/request, {ir_no_memset:,.0f} without memset, "
          f"{mallocs:.1f} malloc calls/request")
    if kib is not None:
        print(f"  per KiB of body: {ir / kib:,.0f} Ir, {ir_no_memset / kib:,.0f} without memset")
    for f, c in hot:
        print(f"  {c / n:>10,.0f}  {f[:110]}")
    for pattern in inclusive:
        matches = [(f, c) for f, c in incl.items() if pattern in f]
        matches.sort(key=lambda fc: -fc[1])
        for f, c in matches[:3]:
            print(f"  inclusive {c / n:>10,.0f}  {f[:100]}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("bins", nargs="+", help="kvgate binaries to count")
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--nginx", action="store_true", help="count nginx as a proxy too")
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--inclusive", action="append", default=[], metavar="PATTERN",
                    help="also print the inclusive cost of functions whose name contains it")
    ap.add_argument("--sim", default="target/release/kvgate-sim")
    ap.add_argument("--body-kib", type=int, help="a user message of N KiB of text")
    ap.add_argument("--unique", action="store_true", help="a different prompt each request")
    ap.add_argument("--policy", default="round_robin", help="kvgate's --policy")
    ap.add_argument("--keep", metavar="DIR", help="copy the callgrind dumps into DIR")
    a = ap.parse_args()
    for tool in ["valgrind", "callgrind_control"] + (["nginx"] if a.nginx else []):
        if shutil.which(tool) is None:
            sys.exit(f"{tool} not found")
    work = tempfile.mkdtemp(prefix="kvgate-callgrind-")
    sim_port = free_port()
    cfg = os.path.join(work, "sim.toml")
    with open(cfg, "w") as f:
        f.write("fixed_response = true\n")
    sim = subprocess.Popen([a.sim, "--engines", "1", "--base-port", str(sim_port),
                            "--config", cfg], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ready(sim_port, "/health")
        upstream = f"http://127.0.0.1:{sim_port}"
        for i, b in enumerate(a.bins):
            port = free_port()
            argv = [b, "--port", str(port), "--worker-urls", upstream, "--policy", a.policy,
                    "--log-level", "warn", "--data-dir", os.path.join(work, f"data{i}")]
            profile(f"kvgate{i}", b, argv, port, "/readiness", a.requests, a.top, work,
                    a.inclusive, a.body_kib, a.unique)
        if a.nginx:
            port = free_port()
            conf = os.path.join(work, "nginx.conf")
            with open(conf, "w") as f:
                f.write(f"""daemon off; master_process off; worker_processes 1;
error_log {work}/nginx-error.log; pid {work}/nginx.pid;
events {{ worker_connections 1024; }}
http {{ access_log off; upstream up {{ server 127.0.0.1:{sim_port}; keepalive 64; }}
  server {{ listen 127.0.0.1:{port};
    location / {{ proxy_pass http://up; proxy_http_version 1.1; proxy_set_header Connection ""; }}
    location = /health {{ return 200; }} }} }}
""")
            profile("nginx", "nginx", ["nginx", "-c", conf, "-p", work], port, "/health",
                    a.requests, a.top, work)
    finally:
        sim.terminate()
        sim.wait(timeout=30)
        if a.keep:
            os.makedirs(a.keep, exist_ok=True)
            for f in os.listdir(work):
                if ".out." in f:
                    shutil.copy(os.path.join(work, f), a.keep)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

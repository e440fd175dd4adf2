#!/usr/bin/env python3
"""Time to first token of streamed completions, N clients at once, against each given port.

A raw-socket client, so nothing between it and the server buffers or batches:
    python3 crates/bench/scripts/ttft_streams.py CONCURRENCY PORT [PORT ...]
prints, per port: requests completed in 4 s, TTFT p50 and p90 in ms. Used in
docs/benchmarks.md to compare an engine reached directly with the same engine behind
kvgate (loopback only).
"""
import json
import socket
import statistics
import sys
import threading
import time

SECONDS = 4.0


def one(port, i):
    body = json.dumps({
        "model": "kvgate-sim-model",
        "prompt": "sys " * 1000 + "q %d" % i,
        "max_tokens": 16,
        "stream": True,
    }).encode()
    s = socket.create_connection(("127.0.0.1", port))
    t0 = time.perf_counter()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % len(body) + body)
    buf, ttft = b"", None
    while True:
        d = s.recv(65536)
        if not d:
            break
        buf += d
        if ttft is None and b"data: {" in buf:
            ttft = (time.perf_counter() - t0) * 1000
        if b"[DONE]" in buf:
            break
    s.close()
    return ttft


def run(port, concurrency):
    results, stop = [], time.time() + SECONDS

    def client(k):
        i = 0
        while time.time() < stop:
            t = one(port, k * 10000 + i)
            if t is not None:
                results.append(t)
            i += 1

    threads = [threading.Thread(target=client, args=(k,)) for k in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    results.sort()
    return len(results), round(statistics.median(results), 1), round(results[int(len(results) * 0.9)], 1)


if __name__ == "__main__":
    conc = int(sys.argv[1])
    for p in sys.argv[2:]:
        n, p50, p90 = run(int(p), conc)
        print("port %s: %d requests, TTFT p50 %.1f ms, p90 %.1f ms" % (p, n, p50, p90))

#!/usr/bin/env python3
"""A fresh gateway in front of idle engines, then multi-turn or shared-prefix traffic.

Starts N `kvgate-sim` engines, waits, starts the gateway (kvgate or smg) and sends the
traffic `--start-after` seconds later with an aiohttp client (a client other than
kvgate-bench's): streamed chat, each turn re-sending the engine's real answer. Prints the
hit rate from the answers' `usage`, the split from `/sim/stats`, TTFT p50/p99 and the
upper-bound ideal by kvgate-bench's rule computed in tokens from `usage` (previous prompt +
answer tokens of the conversation, page-aligned, at most prompt - 1).

    pip install aiohttp
    python3 crates/bench/scripts/fresh_start.py --workload multi-turn --seed 1 \
        --kvgate target/release/kvgate --sim target/release/kvgate-sim
    python3 crates/bench/scripts/fresh_start.py --gateway smg ...

Everything binds 127.0.0.1 on free ports and stops by itself.
"""

import argparse
import asyncio
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time

import aiohttp


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def words(rng, n):
    return "".join("".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(3)) + " " for _ in range(n))


async def wait_up(session, url, path, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            async with session.get(url + path) as r:
                if r.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.05)
    raise RuntimeError(f"{url}{path} did not come up")


async def chat(session, url, model, messages, max_tokens):
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "stream": True,
            "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    ttft, text, usage = None, [], None
    async with session.post(url + "/v1/chat/completions", json=body) as r:
        if r.status != 200:
            raise RuntimeError(f"status {r.status}: {await r.text()}")
        async for raw in r.content:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            if ttft is None:
                ttft = time.perf_counter() - t0
            data = line[5:].strip()
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            if chunk.get("usage"):
                usage = chunk["usage"]
            for c in chunk.get("choices", []):
                piece = (c.get("delta") or {}).get("content")
                if piece:
                    text.append(piece)
    return ttft, "".join(text), usage


def percentile(xs, p):
    xs = sorted(xs)
    if not xs:
        return float("nan")
    k = max(0, min(len(xs) - 1, int(round(p / 100 * len(xs) + 0.5)) - 1))
    return xs[k]


async def run(a):
    rng = random.Random(a.seed)
    procs = []
    try:
        sim_port = free_port()
        cfg = {"max_running_requests": 16, "prefill_tokens_per_sec": 20000.0,
               "decode_step_base": "5ms", "decode_step_per_req": "200us",
               "cache_capacity_tokens": 200000, "enable_cache_report": True,
               "page_size": a.page_size}
        for kv in a.sim_field:
            k, v = kv.split("=", 1)
            cfg[k] = json.loads(v)
            if v == "null":
                del cfg[k]
        cfg_file = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
        json.dump(cfg, cfg_file)
        cfg_file.close()
        # Consecutive ports from a free one; good enough on an idle loopback.
        procs.append(subprocess.Popen([a.sim, "--engines", str(a.engines), "--base-port", str(sim_port),
                                       "--config", cfg_file.name], stdout=subprocess.DEVNULL))
        engines = [f"http://127.0.0.1:{sim_port + i}" for i in range(a.engines)]
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as s:
            for e in engines:
                await wait_up(s, e, "/health")
            # Idle engines, probed now and then as a gateway's health checks would.
            await asyncio.sleep(a.idle_before)
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            data_dir = tempfile.mkdtemp()
            log = open(a.log_file or os.path.join(data_dir, "gateway.log"), "w")
            if a.gateway == "kvgate":
                cmd = [a.kvgate, "--port", str(port), "--data-dir", data_dir, "--worker-urls", *engines,
                       "--log-level", a.log_level]
            else:
                cmd = ["smg", "launch", "--host", "127.0.0.1", "--port", str(port), "--worker-urls", *engines,
                       "--policy", "cache_aware", "--log-level", "warn"]
            procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT))
            await wait_up(s, url, "/health", 60)
            await asyncio.sleep(a.start_after)

            records = []

            async def conversation(c, system):
                messages = [{"role": "system", "content": system}]
                prev = None
                for t in range(a.turns):
                    messages.append({"role": "user", "content": words(rng_c[c], a.question_tokens)})
                    ttft, answer, usage = await chat(s, url, "kvgate-sim-model", messages, a.max_tokens)
                    records.append((c, t, ttft, usage, prev))
                    prev = usage
                    messages.append({"role": "assistant", "content": answer})

            if a.workload == "multi-turn":
                rng_c = [random.Random(rng.random()) for _ in range(a.conversations)]
                systems = [words(rng, a.system_tokens) for _ in range(a.conversations)]
                await asyncio.gather(*(conversation(c, systems[c]) for c in range(a.conversations)))
            else:
                systems = [words(rng, a.system_tokens) for _ in range(a.groups)]
                order = [(g, p) for g in range(a.groups) for p in range(a.prompts)]
                rng.shuffle(order)
                sem = asyncio.Semaphore(a.in_flight)

                async def one(g):
                    async with sem:
                        ttft, _, usage = await chat(s, url, "kvgate-sim-model",
                                                    [{"role": "system", "content": systems[g]},
                                                     {"role": "user", "content": words(rng, a.question_tokens)}],
                                                    a.max_tokens)
                        records.append((g, 0, ttft, usage, None))
                await asyncio.gather(*(one(g) for g, _ in order))

            split = []
            for e in engines:
                async with s.get(e + "/sim/stats") as r:
                    split.append((await r.json())["requests"])
        prompt = sum(r[3]["prompt_tokens"] for r in records)
        # SGLang leaves prompt_tokens_details null when nothing was cached.
        cached = sum((r[3].get("prompt_tokens_details") or {}).get("cached_tokens", 0) for r in records)
        ideal = 0
        page = a.page_size
        if a.workload == "multi-turn":
            for _, _, _, u, prev in records:
                if prev is not None:
                    reuse = min(prev["prompt_tokens"] + prev["completion_tokens"], u["prompt_tokens"] - 1)
                    ideal += reuse // page * page
        ttfts = [r[2] * 1000 for r in records]
        out = {"gateway": a.gateway, "workload": a.workload, "seed": a.seed, "hit": cached / prompt,
               "ideal": ideal / prompt if ideal else None, "split": split,
               "ttft_p50_ms": percentile(ttfts, 50), "ttft_p99_ms": percentile(ttfts, 99)}
        if out["ideal"]:
            out["ratio"] = out["hit"] / out["ideal"]
        print(json.dumps(out))
    finally:
        for p in reversed(procs):
            p.terminate()
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", choices=["multi-turn", "shared-prefix"], default="multi-turn")
    p.add_argument("--gateway", choices=["kvgate", "smg"], default="kvgate")
    p.add_argument("--kvgate", default="target/release/kvgate")
    p.add_argument("--sim", default="target/release/kvgate-sim")
    p.add_argument("--engines", type=int, default=4)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--conversations", type=int, default=16)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--groups", type=int, default=8)
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--in-flight", type=int, default=16)
    p.add_argument("--system-tokens", type=int, default=200)
    p.add_argument("--question-tokens", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--page-size", type=int, default=1)
    p.add_argument("--start-after", type=float, default=0.5)
    p.add_argument("--idle-before", type=float, default=1.0)
    p.add_argument("--log-level", default="info")
    p.add_argument("--log-file", help="where the gateway logs (default: its temp data dir)")
    p.add_argument("--sim-field", action="append", default=[], help="KEY=JSON: one more SimConfig field")
    a = p.parse_args()
    if a.workload == "shared-prefix":
        if "--system-tokens" not in sys.argv:
            a.system_tokens = 1000
        if "--max-tokens" not in sys.argv:
            a.max_tokens = 16
    asyncio.run(run(a))


if __name__ == "__main__":
    main()

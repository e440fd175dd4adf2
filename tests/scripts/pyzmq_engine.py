#!/usr/bin/env python3
"""A stand-in SGLang engine for the KV-event interop test: its events go out through pyzmq
(the real libzmq, as SGLang's own publisher uses), not through kvgate's ZMQ crate.

    python3 tests/scripts/pyzmq_engine.py FIXTURE.json

Serves /v1/models, /server_info (advertising kv_events), /health and /v1/loads on a free
loopback port; binds a PUB socket and a replay ROUTER on free ports. It publishes the first
half of the fixture's batches at once (before anyone subscribes: they come by replay), and
the rest half a second after the first replay request. Prints one JSON line with its URL,
then runs until stdin closes.
"""
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import zmq

fixture = json.load(open(sys.argv[1]))
topic = fixture["topic"].encode()
batches = [(f["seq"], bytes.fromhex(f["payload_hex"])) for f in fixture["frames"]]
ctx = zmq.Context()
pub = ctx.socket(zmq.PUB)
pub_port = pub.bind_to_random_port("tcp://127.0.0.1")
router = ctx.socket(zmq.ROUTER)
replay_port = router.bind_to_random_port("tcp://127.0.0.1")
half = len(batches) // 2
sent = []
lock = threading.Lock()


def publish(seq, payload):
    with lock:
        pub.send_multipart([topic, seq.to_bytes(8, "big"), payload])
        sent.append((seq, payload))


for seq, payload in batches[:half]:
    publish(seq, payload)


def rest():
    time.sleep(0.5)
    for seq, payload in batches[half:]:
        publish(seq, payload)
        time.sleep(0.01)


def serve_replay():
    started = False
    while True:
        ident, empty, start = router.recv_multipart()
        start = int.from_bytes(start, "big")
        with lock:
            todo = [(s, p) for s, p in sent if s >= start]
        for seq, payload in todo:
            router.send_multipart([ident, b"", topic, seq.to_bytes(8, "big"), payload])
        router.send_multipart([ident, b"", b"", (-1).to_bytes(8, "big", signed=True), b""])
        if not started:
            started = True
            threading.Thread(target=rest, daemon=True).start()


threading.Thread(target=serve_replay, daemon=True).start()

INFO = {"model_path": "interop-model", "max_running_requests": 16, "dp_size": 1,
        "page_size": 16, "startup_time": 1733140000.0,
        "kv_events": {"publisher": "zmq", "endpoint_host": "*", "endpoint_port_base": pub_port,
                      "topic": fixture["topic"], "block_size": 16, "dp_size": 1,
                      "replay_endpoint_port_base": replay_port}}


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def answer(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        path = self.path.split("?")[0]
        if path == "/v1/models":
            self.answer(200, {"object": "list", "data": [
                {"id": "interop-model", "object": "model", "owned_by": "sglang"}]})
        elif path in ("/server_info", "/get_server_info"):
            self.answer(200, INFO)
        elif path == "/health":
            self.answer(200, {})
        else:
            self.answer(404, {"error": "not here"})


http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
threading.Thread(target=http.serve_forever, daemon=True).start()
print(json.dumps({"url": f"http://127.0.0.1:{http.server_address[1]}"}), flush=True)
sys.stdin.read()

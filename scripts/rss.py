#!/usr/bin/env python3
"""The gateway's memory under 256 concurrent 1 MiB requests against a
hanging upstream (issue: a global bound on memory in flight).

    cargo build --release -p tower-llm-gateway
    python3 scripts/rss.py [--binary target/release/tower-llm-gateway] [--calls 256]

Starts a loopback upstream that accepts and never answers, the gateway in
front of it (deadline 20 s, one attempt), then opens CALLS connections each
sending a ~1 MiB chat request, and reads the gateway's resident memory
(VmRSS, and the peak VmHWM) from /proc before, during and after. One more
call beyond `max_in_flight` must get 503 at once. Loopback only; bounded in
count and time.
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def hanging_upstream(port, stop):
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", port))
    srv.listen(1024)
    srv.settimeout(0.2)
    held = []

    def drain(conn):
        conn.settimeout(0.5)
        while not stop.is_set():
            try:
                if not conn.recv(1 << 16):
                    return
            except socket.timeout:
                continue
            except OSError:
                return

    while not stop.is_set():
        try:
            conn, _ = srv.accept()
        except socket.timeout:
            continue
        held.append(conn)
        threading.Thread(target=drain, args=(conn,), daemon=True).start()
    for c in held:
        c.close()
    srv.close()


def status(pid):
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("VmRSS", "VmHWM")):
                k, v = line.split(":")
                out[k] = int(v.split()[0]) // 1024
    return out


def call(port, body, results, i):
    req = (
        "POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\n"
        "content-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    ).encode() + body
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
            s.sendall(req)
            head = s.recv(64).decode(errors="replace")
            results[i] = head.split(" ")[1] if " " in head else "?"
    except OSError as e:
        results[i] = f"error {e}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", default="target/release/tower-llm-gateway")
    ap.add_argument("--calls", type=int, default=256)
    args = ap.parse_args()

    up, gw = free_port(), free_port()
    stop = threading.Event()
    threading.Thread(target=hanging_upstream, args=(up, stop), daemon=True).start()
    policy = f"""
[deadline]
total_ms = 20000
[retry]
max_attempts = 1
[server]
max_in_flight = {args.calls}
[[providers]]
name = "hang"
kind = "openai"
base_url = "http://127.0.0.1:{up}/v1"
api_key_env = "RSS_KEY"
[[routes]]
model = "smart"
chain = [{{ provider = "hang", model = "m" }}]
"""
    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as f:
        f.write(policy)
        path = f.name
    env = dict(os.environ, RSS_KEY="sk-rss")
    proc = subprocess.Popen(
        [args.binary, "--config", path, "--listen", f"127.0.0.1:{gw}"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        proc.stdout.readline()
        time.sleep(0.5)
        idle = status(proc.pid)
        text = "word " * ((1024 * 1024 - 200) // 5)
        body = json.dumps(
            {"model": "smart", "messages": [{"role": "user", "content": text}]}
        ).encode()
        results = [None] * (args.calls + 1)
        threads = [
            threading.Thread(target=call, args=(gw, body, results, i))
            for i in range(args.calls)
        ]
        for t in threads:
            t.start()
        time.sleep(5)
        loaded = status(proc.pid)
        extra = threading.Thread(target=call, args=(gw, body, results, args.calls))
        extra.start()
        extra.join(10)
        for t in threads:
            t.join(30)
        after = status(proc.pid)
        print(f"request body: {len(body) / 1048576:.2f} MiB, {args.calls} concurrent calls")
        print(f"RSS idle:        {idle['VmRSS']} MiB")
        print(f"RSS under load:  {loaded['VmRSS']} MiB (peak {loaded['VmHWM']} MiB)")
        print(f"RSS after:       {after['VmRSS']} MiB (peak {after['VmHWM']} MiB)")
        print(f"call {args.calls + 1} beyond max_in_flight: {results[args.calls]}")
        answered = {}
        for r in results[: args.calls]:
            answered[r] = answered.get(r, 0) + 1
        print(f"the {args.calls} calls ended with: {answered}")
    finally:
        proc.terminate()
        proc.wait(30)
        stop.set()
        os.unlink(path)


if __name__ == "__main__":
    sys.exit(main())

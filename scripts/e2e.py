#!/usr/bin/env python3
"""End-to-end load test: the gateway (tower-llm-gateway) in release mode in front of a
zero-delay loopback provider, against the provider called directly.

    python3 scripts/e2e.py                 # both scenarios, 20 s per run
    python3 scripts/e2e.py --seconds 5     # quicker

Installs the `oha` load generator with `cargo install oha --locked` if it is
missing. Scenarios:

- healthy: one provider answering at once; the gateway side by side with
  a bare hyper reverse proxy (`examples/bare_proxy.rs`: accept, read the
  body, forward with the pooled client, stream the answer back), the floor
  a gateway on this stack can reach, and the gateway's figures as ratios
  to it;
- rate-limited: the primary answers 429 with `Retry-After: 1` to 30 % of
  calls, a healthy fallback behind it (the gateway must hide every 429).

For each, at fixed rates on 64 keep-alive connections: latency percentiles
direct vs through the gateway, the added latency, the gateway's CPU per
request (from /proc), errors; then the highest rate held without errors
(unthrottled, 64 connections). Prints Markdown tables. Linux only (/proc).
"""

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BODY = '{"model": "smart", "messages": [{"role": "user", "content": "Hello"}]}'
DIRECT_BODY = '{"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Hello"}]}'
TICKS = os.sysconf("SC_CLK_TCK")


def sh(cmd, **kw):
    print("+", " ".join(cmd), file=sys.stderr)
    return subprocess.run(cmd, check=True, **kw)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, seconds=60):
    deadline = time.time() + seconds
    while time.time() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing listens on port {port}")


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # utime and stime are fields 14 and 15; after ")" they are 12th and 13th.
    return (int(fields[11]) + int(fields[12])) / TICKS


def oha():
    path = shutil.which("oha") or os.path.expanduser("~/.cargo/bin/oha")
    if not os.path.exists(path):
        sh(["cargo", "install", "oha", "--locked"])
        path = os.path.expanduser("~/.cargo/bin/oha")
    return path


def load(oha_bin, url, body, seconds, rate, connections=64):
    cmd = [oha_bin, "--no-tui", "--output-format", "json", "-z", f"{seconds}s",
           "-c", str(connections), "-m", "POST", "-H", "content-type: application/json",
           "-d", body, url]
    if rate:
        cmd[1:1] = ["-q", str(rate)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def summary(result):
    lat = result.get("latencyPercentiles", {})
    statuses = result.get("statusCodeDistribution", {})
    ok = sum(n for code, n in statuses.items() if code.startswith("2"))
    errors = sum(n for code, n in statuses.items() if not code.startswith("2"))
    # In-flight requests cut by the end of the run are not errors.
    errors += sum(n for kind, n in result.get("errorDistribution", {}).items()
                  if "aborted due to deadline" not in kind)
    ms = lambda key: 1000.0 * (lat.get(key) or 0.0)
    return {
        "p50": ms("p50"), "p90": ms("p90"), "p99": ms("p99"), "p99.9": ms("p99.9"),
        "ok": ok, "errors": errors, "rps": result.get("summary", {}).get("requestsPerSec", 0.0),
    }


def gateway_config(providers, chain):
    text = """
[deadline]
total_ms = 30000
[retry]
max_attempts = 3
attempt_timeout_ms = 10000
base_ms = 50
factor = 4
max_ms = 800
jitter = 0.2
"""
    for name, kind, url in providers:
        text += f"""
[[providers]]
name = "{name}"
kind = "{kind}"
base_url = "{url}"
api_key_env = "E2E_KEY"
"""
    links = ", ".join(f'{{ provider = "{p}", model = "{m}" }}' for p, m in chain)
    text += f'\n[[routes]]\nmodel = "smart"\nchain = [{links}]\n'
    return text


def scenario(name, oha_bin, seconds, rates):
    ports = [free_port(), free_port()]
    if name == "healthy":
        upstream = subprocess.Popen(
            [f"{ROOT}/target/release/examples/mock_upstream", "healthy", f"127.0.0.1:{ports[0]}"],
            stdout=subprocess.DEVNULL)
        providers = [("primary", "openai", f"http://127.0.0.1:{ports[0]}/v1")]
        chain = [("primary", "gpt-4o-mini")]
    else:
        upstream = subprocess.Popen(
            [f"{ROOT}/target/release/examples/mock_upstream", "rate-limited",
             f"127.0.0.1:{ports[0]}", f"127.0.0.1:{ports[1]}"], stdout=subprocess.DEVNULL)
        providers = [("primary", "openai", f"http://127.0.0.1:{ports[0]}/v1"),
                     ("fallback", "anthropic", f"http://127.0.0.1:{ports[1]}")]
        chain = [("primary", "gpt-4o-mini"), ("fallback", "claude-x")]
    wait_port(ports[0])
    gw_port = free_port()
    config = tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False)
    config.write(gateway_config(providers, chain))
    config.close()
    env = dict(os.environ, E2E_KEY="e2e-key")
    gateway = subprocess.Popen(
        [f"{ROOT}/target/release/tower-llm-gateway", "--config", config.name,
         "--listen", f"127.0.0.1:{gw_port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    bare = None
    bare_port = free_port()
    if name == "healthy":
        bare = subprocess.Popen(
            [f"{ROOT}/target/release/examples/bare_proxy", f"127.0.0.1:{bare_port}",
             f"http://127.0.0.1:{ports[0]}"], stdout=subprocess.DEVNULL)
    rows = []
    bare_rows = []
    bare_top = None
    try:
        wait_port(gw_port)
        if bare:
            wait_port(bare_port)
        direct_url = f"http://127.0.0.1:{ports[0]}/v1/chat/completions"
        gw_url = f"http://127.0.0.1:{gw_port}/v1/chat/completions"
        load(oha_bin, gw_url, BODY, 2, 500)  # warm up pools
        for rate in rates:
            direct = summary(load(oha_bin, direct_url, DIRECT_BODY, seconds, rate))
            before = cpu_seconds(gateway.pid)
            through = summary(load(oha_bin, gw_url, BODY, seconds, rate))
            cpu = cpu_seconds(gateway.pid) - before
            requests = max(through["ok"] + through["errors"], 1)
            rows.append((rate, direct, through, 1e6 * cpu / requests))
            if bare:
                bare_url = f"http://127.0.0.1:{bare_port}/v1/chat/completions"
                before = cpu_seconds(bare.pid)
                proxied = summary(load(oha_bin, bare_url, DIRECT_BODY, seconds, rate))
                cpu = cpu_seconds(bare.pid) - before
                served = max(proxied["ok"] + proxied["errors"], 1)
                bare_rows.append((rate, direct, proxied, 1e6 * cpu / served))
        top = summary(load(oha_bin, gw_url, BODY, seconds, None))
        if bare:
            bare_top = summary(load(oha_bin, f"http://127.0.0.1:{bare_port}/v1/chat/completions",
                                    DIRECT_BODY, seconds, None))
    finally:
        for p in [q for q in (gateway, upstream, bare) if q]:
            p.send_signal(signal.SIGINT)
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        os.unlink(config.name)
    print(f"\n### {name}\n")
    print("| rate | path | p50 | p90 | p99 | p99.9 | errors | added p50 | added p99 | gateway CPU per request |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for rate, d, g, cpu_us in rows:
        direct_errors = d["errors"] if name == "healthy" else f'{d["errors"]} (429s by design)'
        print(f'| {rate}/s | direct | {d["p50"]:.3f} ms | {d["p90"]:.3f} ms | {d["p99"]:.3f} ms | '
              f'{d["p99.9"]:.3f} ms | {direct_errors} | | | |')
        print(f'| {rate}/s | gateway | {g["p50"]:.3f} ms | {g["p90"]:.3f} ms | {g["p99"]:.3f} ms | '
              f'{g["p99.9"]:.3f} ms | {g["errors"]} | {g["p50"] - d["p50"]:+.3f} ms | '
              f'{g["p99"] - d["p99"]:+.3f} ms | {cpu_us:.0f} µs |')
    print(f'\nunthrottled, 64 connections, {seconds} s: {top["rps"]:.0f} requests/s through the gateway, '
          f'{top["errors"]} errors, p99 {top["p99"]:.3f} ms')
    if bare_rows:
        print("\nthe bare hyper proxy in the same run, and the gateway as a ratio to it:\n")
        print("| rate | bare: added p50 | bare: added p99 | bare: CPU per request | gateway / bare: CPU per request |")
        print("|---|---|---|---|---|")
        for (rate, d, b, bare_cpu), (_, _, _, gw_cpu) in zip(bare_rows, rows):
            print(f'| {rate}/s | {b["p50"] - d["p50"]:+.3f} ms | {b["p99"] - d["p99"]:+.3f} ms | '
                  f'{bare_cpu:.0f} µs | {gw_cpu / max(bare_cpu, 1e-9):.2f}× |')
        print(f'\nunthrottled: bare proxy {bare_top["rps"]:.0f} requests/s; gateway / bare: '
              f'{top["rps"] / max(bare_top["rps"], 1e-9):.2f}×')


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=int, default=20)
    parser.add_argument("--rates", default="1000,5000")
    parser.add_argument("--scenario", choices=["healthy", "rate-limited", "both"], default="both")
    args = parser.parse_args()
    oha_bin = oha()
    sh(["cargo", "build", "--release", "-p", "tower-llm-gateway", "--bin", "tower-llm-gateway"], cwd=ROOT)
    sh(["cargo", "build", "--release", "--example", "mock_upstream", "--example", "bare_proxy"], cwd=ROOT)
    rates = [int(r) for r in args.rates.split(",")]
    print(f"machine: {os.cpu_count()} CPUs; {args.seconds} s per run; oha on 64 connections")
    for name in (["healthy", "rate-limited"] if args.scenario == "both" else [args.scenario]):
        scenario(name, oha_bin, args.seconds, rates)


if __name__ == "__main__":
    main()

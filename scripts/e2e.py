#!/usr/bin/env python3
"""End-to-end load test: the gateway (tower-llm-gateway) in release mode in front of a
zero-delay loopback provider, against the provider called directly.

    python3 scripts/e2e.py                            # every scenario, 20 s per run, 3 rounds
    python3 scripts/e2e.py --seconds 5 --rounds 1     # quicker

Installs the `oha` load generator with `cargo install oha --locked` if it is
missing. Scenarios:

- healthy: one provider answering at once; the gateway side by side with
  a bare hyper reverse proxy (`examples/bare_proxy.rs`: accept, read the
  body, forward with the pooled client, stream the answer back), the floor
  a gateway on this stack can reach, and the gateway's figures as ratios
  to it, checked against the targets of the gateway-speed issue. The
  machine is shared and noisy: each figure is the median of `--rounds`
  runs, the three paths taking turns within each round;
- streaming: the same provider streaming 50 chunks; time to first token
  (first `data:` event) direct, through the bare proxy and through the
  gateway, one call at a time on a kept-alive connection, and CPU per
  streamed chunk;
- rate-limited: the primary answers 429 with `Retry-After: 1` to 30 % of
  calls, a healthy fallback behind it (the gateway must hide every 429).

For the first two, at fixed rates on 64 keep-alive connections: latency
percentiles direct vs through the gateway, the added latency, the
gateway's CPU per request (from /proc), errors; then the highest rate held
without errors (unthrottled, 64 connections). Prints Markdown tables.
Linux only (/proc).
"""

import argparse
import http.client
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BODY = '{"model": "smart", "messages": [{"role": "user", "content": "Hello"}]}'
DIRECT_BODY = '{"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Hello"}]}'
STREAM_CHUNKS = 50  # what mock_upstream streams
# The gateway-speed issue's targets.
TARGETS = {"added_p50": 0.15, "added_p99": 0.30, "cpu_us": 140.0, "cpu_ratio": 1.3,
           "rps_ratio": 0.75, "ttft_p50": 0.20}
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


def start(name, ports):
    """The upstream(s), the gateway and (healthy) the bare proxy."""
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
    bare, bare_port = None, free_port()
    if name == "healthy":
        bare = subprocess.Popen(
            [f"{ROOT}/target/release/examples/bare_proxy", f"127.0.0.1:{bare_port}",
             f"http://127.0.0.1:{ports[0]}"], stdout=subprocess.DEVNULL)
    wait_port(gw_port)
    if bare:
        wait_port(bare_port)
    return upstream, gateway, bare, gw_port, bare_port, config.name


def stop(processes, config):
    for p in [q for q in processes if q]:
        p.send_signal(signal.SIGINT)
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
    os.unlink(config)


def measured(oha_bin, url, body, seconds, rate, pid):
    """One load run; the latency summary and (with `pid`) CPU per request."""
    before = cpu_seconds(pid) if pid else 0.0
    out = summary(load(oha_bin, url, body, seconds, rate))
    if pid:
        out["cpu"] = 1e6 * (cpu_seconds(pid) - before) / max(out["ok"] + out["errors"], 1)
    return out


def median(runs, key):
    return statistics.median(r[key] for r in runs)


def verdict(ok):
    return "met" if ok else "**missed**"


def scenario(name, oha_bin, seconds, rates, rounds):
    ports = [free_port(), free_port()]
    upstream, gateway, bare, gw_port, bare_port, config = start(name, ports)
    direct_url = f"http://127.0.0.1:{ports[0]}/v1/chat/completions"
    gw_url = f"http://127.0.0.1:{gw_port}/v1/chat/completions"
    bare_url = f"http://127.0.0.1:{bare_port}/v1/chat/completions"
    paths = [("direct", direct_url, DIRECT_BODY, None), ("gateway", gw_url, BODY, gateway.pid)]
    if bare:
        paths.append(("bare", bare_url, DIRECT_BODY, bare.pid))
    results = {}  # (rate, path) -> [runs]
    try:
        load(oha_bin, gw_url, BODY, 2, 500)  # warm up pools
        if bare:
            load(oha_bin, bare_url, DIRECT_BODY, 2, 500)
        for r in range(rounds):
            for rate in rates + [None]:
                # Take turns: a slow spell of the machine does not land on
                # one path only.
                turn = paths[r % len(paths):] + paths[:r % len(paths)]
                for path, url, body, pid in turn:
                    if rate is None and path == "direct":
                        continue
                    results.setdefault((rate, path), []).append(
                        measured(oha_bin, url, body, seconds, rate, pid))
    finally:
        stop((gateway, upstream, bare), config)
    print(f"\n### {name}\n")
    print(f"median of {rounds} round(s) of {seconds} s each\n")
    print("| rate | path | p50 | p90 | p99 | p99.9 | errors | added p50 | added p99 | CPU per request |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for rate in rates:
        d = results[(rate, "direct")]
        for path in [p[0] for p in paths]:
            runs = results[(rate, path)]
            errors = sum(x["errors"] for x in runs)
            if path == "direct" and name != "healthy":
                errors = f"{errors} (429s by design)"
            added = "| |" if path == "direct" else (
                f'| {median(runs, "p50") - median(d, "p50"):+.3f} ms '
                f'| {median(runs, "p99") - median(d, "p99"):+.3f} ms')
            cpu = "" if path == "direct" else f'{median(runs, "cpu"):.0f} µs'
            print(f'| {rate}/s | {path} | {median(runs, "p50"):.3f} ms | {median(runs, "p90"):.3f} ms '
                  f'| {median(runs, "p99"):.3f} ms | {median(runs, "p99.9"):.3f} ms | {errors} '
                  f'{added} | {cpu} |')
    top = results[(None, "gateway")]
    print(f'\nunthrottled, 64 connections: {median(top, "rps"):.0f} requests/s through the gateway, '
          f'{sum(x["errors"] for x in top)} errors')
    if not bare:
        return
    bare_top = results[(None, "bare")]
    print(f'unthrottled: bare proxy {median(bare_top, "rps"):.0f} requests/s')
    print("\nthe gateway against the issue's targets (bare = the bare hyper proxy, same run):\n")
    print("| target | wanted | measured | |")
    print("|---|---|---|---|")
    for rate in rates:
        d, g, b = results[(rate, "direct")], results[(rate, "gateway")], results[(rate, "bare")]
        added50 = median(g, "p50") - median(d, "p50")
        added99 = median(g, "p99") - median(d, "p99")
        cpu, bare_cpu = median(g, "cpu"), median(b, "cpu")
        print(f'| added p50 at {rate}/s | ≤ {TARGETS["added_p50"]:.2f} ms | {added50:+.3f} ms '
              f'| {verdict(added50 <= TARGETS["added_p50"])} |')
        print(f'| added p99 at {rate}/s | ≤ {TARGETS["added_p99"]:.2f} ms | {added99:+.3f} ms '
              f'| {verdict(added99 <= TARGETS["added_p99"])} |')
        print(f'| CPU per request at {rate}/s | ≤ {TARGETS["cpu_us"]:.0f} µs | {cpu:.0f} µs '
              f'| {verdict(cpu <= TARGETS["cpu_us"])} |')
        print(f'| CPU per request at {rate}/s, gateway / bare | ≤ {TARGETS["cpu_ratio"]:.2f}× '
              f'| {cpu / max(bare_cpu, 1e-9):.2f}× ({cpu:.0f} / {bare_cpu:.0f} µs) '
              f'| {verdict(cpu / max(bare_cpu, 1e-9) <= TARGETS["cpu_ratio"])} |')
    ratio = median(top, "rps") / max(median(bare_top, "rps"), 1e-9)
    print(f'| unthrottled throughput, gateway / bare | ≥ {TARGETS["rps_ratio"]:.2f}× | {ratio:.2f}× '
          f'({median(top, "rps"):.0f} / {median(bare_top, "rps"):.0f}) '
          f'| {verdict(ratio >= TARGETS["rps_ratio"])} |')


def first_token(conn, path, body):
    """Sends one streamed call on `conn`; seconds to the first `data:`
    event and to the end of the stream."""
    started = time.perf_counter()
    conn.request("POST", path, body=body, headers={"content-type": "application/json"})
    res = conn.getresponse()
    seen, first = b"", None
    while True:
        data = res.read1(65536)
        if not data:
            break
        if first is None:
            seen += data
            if b"data:" in seen:
                first = time.perf_counter() - started
    if res.status != 200 or first is None:
        raise RuntimeError(f"{path}: status {res.status}, no data event")
    return first, time.perf_counter() - started


def streaming(seconds, rounds):
    ports = [free_port(), free_port()]
    upstream, gateway, bare, gw_port, bare_port, config = start("healthy", ports)
    stream_body = lambda model: json.dumps({"model": model, "stream": True,
                                            "messages": [{"role": "user", "content": "Hello"}]})
    paths = [("direct", ports[0], "/v1/chat/completions", stream_body("gpt-4o-mini"), None),
             ("gateway", gw_port, "/v1/chat/completions", stream_body("smart"), gateway.pid),
             ("bare", bare_port, "/v1/chat/completions", stream_body("gpt-4o-mini"), bare.pid)]
    results = {}
    try:
        for r in range(rounds):
            turn = paths[r % len(paths):] + paths[:r % len(paths)]
            for path, port, url, body, pid in turn:
                conn = http.client.HTTPConnection("127.0.0.1", port)
                for _ in range(50):  # warm up
                    first_token(conn, url, body)
                before = cpu_seconds(pid) if pid else 0.0
                ttft, calls = [], 0
                deadline = time.time() + seconds
                while time.time() < deadline:
                    ttft.append(first_token(conn, url, body)[0])
                    calls += 1
                cpu = (cpu_seconds(pid) - before) if pid else 0.0
                conn.close()
                ttft.sort()
                results.setdefault(path, []).append({
                    "p50": 1000 * ttft[len(ttft) // 2], "p99": 1000 * ttft[int(len(ttft) * 0.99)],
                    "calls": calls, "chunk_cpu": 1e6 * cpu / max(calls * STREAM_CHUNKS, 1),
                    "call_cpu": 1e6 * cpu / max(calls, 1)})
    finally:
        stop((gateway, upstream, bare), config)
    print("\n### streaming\n")
    print(f"{STREAM_CHUNKS} chunks per call, one call at a time on a kept-alive connection; "
          f"median of {rounds} round(s) of {seconds} s each\n")
    print("| path | time to first token p50 | p99 | added p50 | CPU per call | CPU per streamed chunk |")
    print("|---|---|---|---|---|---|")
    d = results["direct"]
    for path in ("direct", "bare", "gateway"):
        runs = results[path]
        added = "" if path == "direct" else f'{median(runs, "p50") - median(d, "p50"):+.3f} ms'
        cpu = ("", "") if path == "direct" else (f'{median(runs, "call_cpu"):.0f} µs',
                                                 f'{median(runs, "chunk_cpu"):.1f} µs')
        print(f'| {path} | {median(runs, "p50"):.3f} ms | {median(runs, "p99"):.3f} ms | {added} '
              f'| {cpu[0]} | {cpu[1]} |')
    added = median(results["gateway"], "p50") - median(d, "p50")
    print(f'\nadded time to first token, gateway, p50: {added:+.3f} ms (target ≤ '
          f'{TARGETS["ttft_p50"]:.2f} ms: {verdict(added <= TARGETS["ttft_p50"])})')


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=int, default=20)
    parser.add_argument("--rates", default="1000,5000")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--scenario", choices=["healthy", "streaming", "rate-limited", "all"],
                        default="all")
    args = parser.parse_args()
    oha_bin = oha()
    sh(["cargo", "build", "--release", "-p", "tower-llm-gateway", "--bin", "tower-llm-gateway"], cwd=ROOT)
    sh(["cargo", "build", "--release", "--example", "mock_upstream", "--example", "bare_proxy"], cwd=ROOT)
    rates = [int(r) for r in args.rates.split(",")]
    print(f"machine: {os.cpu_count()} CPUs; {args.seconds} s per run; oha on 64 connections")
    for name in (["healthy", "streaming", "rate-limited"] if args.scenario == "all"
                 else [args.scenario]):
        if name == "streaming":
            streaming(args.seconds, args.rounds)
        else:
            scenario(name, oha_bin, args.seconds, rates, args.rounds)


if __name__ == "__main__":
    main()

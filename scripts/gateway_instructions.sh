#!/usr/bin/env bash
# Instructions per call of the gateway binary (or the bare hyper proxy), by
# callgrind: repeatable whatever else the machine does. Runs the release
# binary under valgrind twice, with N and 3N calls (oha, 8 connections,
# 200/s), and prints the difference per call, start-up excluded.
#
#   scripts/gateway_instructions.sh            # the gateway, N = 300
#   scripts/gateway_instructions.sh bare 300   # examples/bare_proxy.rs
#
# Needs valgrind and oha (`cargo install oha --locked`).
set -euo pipefail
cd "$(dirname "$0")/.."
WHAT=${1:-gateway}
N=${2:-300}
cargo build -q --release -p tower-llm-gateway --bin tower-llm-gateway
cargo build -q --release --example mock_upstream --example bare_proxy
BIN=target/release
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
UP=$(free_port)
GW=$(free_port)
WORK=$(mktemp -d)
$BIN/examples/mock_upstream healthy 127.0.0.1:$UP >/dev/null &
UPID=$!
trap 'kill $UPID 2>/dev/null; rm -rf "$WORK"' EXIT
cat > "$WORK/gateway.toml" <<T
[deadline]
total_ms = 30000
[retry]
max_attempts = 3
attempt_timeout_ms = 10000
[[providers]]
name = "primary"
kind = "openai"
base_url = "http://127.0.0.1:$UP/v1"
api_key_env = "E2E_KEY"
[[routes]]
model = "smart"
chain = [{ provider = "primary", model = "gpt-4o-mini" }]
T
run() {
    local n=$1 out=$2 pid body
    if [ "$WHAT" = gateway ]; then
        E2E_KEY=k valgrind --tool=callgrind --callgrind-out-file="$out" \
            $BIN/tower-llm-gateway --config "$WORK/gateway.toml" --listen 127.0.0.1:$GW --workers 1 \
            >/dev/null 2>&1 &
        pid=$!
        body='{"model": "smart", "messages": [{"role": "user", "content": "Hello"}]}'
    else
        valgrind --tool=callgrind --callgrind-out-file="$out" \
            $BIN/examples/bare_proxy 127.0.0.1:$GW http://127.0.0.1:$UP >/dev/null 2>&1 &
        pid=$!
        body='{"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Hello"}]}'
    fi
    for _ in $(seq 1 150); do
        if (echo > /dev/tcp/127.0.0.1/$GW) 2>/dev/null; then break; fi
        sleep 0.2
    done
    oha --no-tui -n "$n" -c 8 -q 200 -m POST -H 'content-type: application/json' -d "$body" \
        http://127.0.0.1:$GW/v1/chat/completions >/dev/null
    # The gateway stops on SIGINT; the bare proxy has no handler.
    if [ "$WHAT" = gateway ]; then kill -INT $pid; else kill -TERM $pid; fi
    wait $pid 2>/dev/null || true
    grep -E "^(summary|totals):" "$out" | head -1 | awk '{print $2}'
}
A=$(run "$N" "$WORK/a.out")
B=$(run $((3 * N)) "$WORK/b.out")
cp "$WORK/b.out" "target/callgrind.$WHAT.out"
echo "$WHAT: $(( (B - A) / (2 * N) )) instructions per call (profile: target/callgrind.$WHAT.out)"

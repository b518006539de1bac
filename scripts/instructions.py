#!/usr/bin/env python3
"""Instructions per call of the stack bench's variants (`http::Request`)
and of the typed bench's (`ChatRequest`, 20 messages, a terminal that
pends once), counted by valgrind (deterministic: unlike nanoseconds on a
shared VM, the figures do not move between runs).

    python3 scripts/instructions.py [stack|typed]

Builds `benches/stack.rs` and `benches/typed.rs` (release), then runs each
variant under `valgrind --tool=callgrind` twice, with N and 2N calls; the
difference divided by N is the cost of one call, free of start-up. Needs
valgrind (`apt-get install -y valgrind`); this script does not install it.
"""

import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

STACK_VARIANTS = [
    ("bare", "bare service"),
    ("tower", "tower::timeout + tower::retry"),
    ("resilience", "tower-resilience limiter + retry + breaker"),
    ("deadline+retry", "tower-llm deadline + retry"),
    ("healthy", "tower-llm full stack, healthy"),
    ("open", "tower-llm full stack, primary circuit open"),
]
TYPED_VARIANTS = [
    ("bare", "bare service"),
    ("tower", "tower::timeout + tower::retry"),
    ("resilience", "tower-resilience limiter + retry + breaker"),
    ("healthy", "tower-llm full stack, healthy"),
    ("open", "tower-llm full stack, primary circuit open"),
    ("priced", "tower-llm full stack + a cost layer per link"),
    ("budget", "tower-llm full stack + cost layers + a budget"),
    ("quota", "tower-llm full stack + cost layers + a quota in memory"),
    ("pool", "tower-llm full stack, each link a pool of 3"),
    ("paced", "tower-llm full stack, each link a paced pool of 3"),
]
N = 1000


def bench_binary(root, bench):
    out = subprocess.run(
        ["cargo", "bench", "--bench", bench, "--no-run", "--message-format=json"],
        cwd=root, check=True, capture_output=True, text=True,
    ).stdout
    for line in out.splitlines():
        m = re.search(r'"executable":"([^"]+/' + bench + r'-[0-9a-f]+)"', line)
        if m:
            return m.group(1)
    sys.exit(f"could not find the {bench} bench binary")


def instructions(binary, knob, variant, calls, tmp):
    out = os.path.join(tmp, f"cg.{knob}.{variant}.{calls}")
    env = dict(os.environ, **{knob: f"{variant}:{calls}"})
    subprocess.run(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", binary, "--bench"],
        env=env, check=True, capture_output=True,
    )
    with open(out) as f:
        for line in f:
            if line.startswith("summary:") or line.startswith("totals:"):
                return int(line.split()[1])
    sys.exit(f"no totals in {out}")


def main():
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is not installed (apt-get install -y valgrind)")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    only = sys.argv[1] if len(sys.argv) > 1 else None
    for bench, knob, variants, title in [
        ("stack", "STACK_PROFILE", STACK_VARIANTS, "http::Request, a terminal that answers at once"),
        ("typed", "TYPED_PROFILE", TYPED_VARIANTS, "ChatRequest of 20 messages, a terminal that pends once"),
    ]:
        if only and only != bench:
            continue
        binary = bench_binary(root, bench)
        with tempfile.TemporaryDirectory() as tmp:
            rows = []
            for variant, name in variants:
                one = instructions(binary, knob, variant, N, tmp)
                two = instructions(binary, knob, variant, 2 * N, tmp)
                rows.append((name, (two - one) / N))
        bare = rows[0][1]
        print(f"{title}: instructions per call (valgrind callgrind, {N} vs {2 * N} calls):")
        for name, per_call in rows:
            print(f"  {name:<44} {per_call:>7,.0f}  (+{per_call - bare:,.0f} over bare)")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""The official OpenAI and Anthropic Python SDKs against the built gateway.

Starts a mock upstream (OpenAI's chat and embeddings, Anthropic's
messages, on one loopback port), writes a policy over it, starts the
gateway binary given as the first argument, and drives it with both
SDKs: unary, streaming, a tool call (unary and streamed), error mapping
and embeddings; each SDK also reaches an upstream of the other dialect.
Exits non-zero, naming the check, on the first failure.

    python3 scripts/sdk_check.py target/debug/tower-llm-gateway

`.ci/run` installs the SDKs (pinned) in a virtual environment and runs it.
"""

import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import anthropic
import openai

TOOL = {
    "name": "weather",
    "description": "The weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}


def vector(i):
    return [0.5 * i, 1.0, -1.0]


class Upstream(BaseHTTPRequestHandler):
    """OpenAI at /v1/chat/completions and /v1/embeddings, Anthropic at
    /v1/messages. The model `upstream-broken` answers a 400."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def send_json(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def send_events(self, events):
        data = b"".join(events)
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):
        length = int(self.headers.get("content-length", "0"))
        body = json.loads(self.rfile.read(length) or b"{}")
        if body.get("model") == "upstream-broken":
            return self.send_json(
                400,
                {"error": {"message": "upstream refused: bad parameter", "type": "invalid_request_error", "code": None}},
            )
        if self.path == "/v1/chat/completions":
            return self.openai_chat(body)
        if self.path == "/v1/embeddings":
            data = [{"object": "embedding", "index": i, "embedding": vector(i)} for i in range(len(body["input"]))]
            return self.send_json(200, {"object": "list", "data": data, "model": body["model"], "usage": {"prompt_tokens": 4, "total_tokens": 4}})
        if self.path == "/v1/messages":
            return self.anthropic_messages(body)
        self.send_json(404, {"error": {"message": "no such path", "type": "not_found"}})

    def openai_chat(self, body):
        wants_tool = bool(body.get("tools")) and body["messages"][-1]["role"] == "user"
        usage = {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14}
        if not body.get("stream"):
            if wants_tool:
                message = {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": "{\"city\": \"Lyon\"}"}}]}
                finish = "tool_calls"
            else:
                message = {"role": "assistant", "content": "Hello from OpenAI"}
                finish = "stop"
            return self.send_json(200, {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": body["model"],
                                        "choices": [{"index": 0, "message": message, "finish_reason": finish}], "usage": usage})

        def chunk(delta, finish=None, usage=None):
            c = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": body["model"],
                 "choices": [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]}
            if usage:
                c["usage"] = usage
            return b"data: " + json.dumps(c).encode() + b"\n\n"

        if wants_tool:
            events = [
                chunk({"role": "assistant", "tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": {"name": "weather", "arguments": ""}}]}),
                chunk({"tool_calls": [{"index": 0, "function": {"arguments": "{\"city\": "}}]}),
                chunk({"tool_calls": [{"index": 0, "function": {"arguments": "\"Lyon\"}"}}]}),
                chunk({}, "tool_calls"),
            ]
        else:
            events = [chunk({"role": "assistant", "content": piece}) for piece in ["Hello", " from", " OpenAI"]]
            events.append(chunk({}, "stop"))
        events.append(chunk(None, usage=usage))
        events.append(b"data: [DONE]\n\n")
        self.send_events(events)

    def anthropic_messages(self, body):
        usage = {"input_tokens": 9, "output_tokens": 4}
        if not body.get("stream"):
            return self.send_json(200, {"id": "msg_1", "type": "message", "role": "assistant", "model": body["model"],
                                        "content": [{"type": "text", "text": "Hello from Anthropic"}],
                                        "stop_reason": "end_turn", "stop_sequence": None, "usage": usage})

        def event(kind, data):
            data["type"] = kind
            return f"event: {kind}\ndata: {json.dumps(data)}\n\n".encode()

        events = [
            event("message_start", {"message": {"id": "msg_1", "type": "message", "role": "assistant", "model": body["model"],
                                                "content": [], "stop_reason": None, "stop_sequence": None,
                                                "usage": {"input_tokens": 9, "output_tokens": 1}}}),
            event("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}),
        ]
        for piece in ["Hello", " from", " Anthropic"]:
            events.append(event("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": piece}}))
        events += [
            event("content_block_stop", {"index": 0}),
            event("message_delta", {"delta": {"stop_reason": "end_turn", "stop_sequence": None}, "usage": {"output_tokens": 4}}),
            event("message_stop", {}),
        ]
        self.send_events(events)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


POLICY = """
[deadline]
total_ms = 10000

[retry]
max_attempts = 1
attempt_timeout_ms = 5000
base_ms = 50
factor = 2
max_ms = 200
jitter = 0.2

[breaker]
consecutive_failures = 100
cooldown_ms = 1000

[[providers]]
name = "oai"
kind = "openai"
base_url = "{up}/v1"
api_key_env = "SDK_CHECK_KEY"

[[providers]]
name = "anth"
kind = "anthropic"
base_url = "{up}"
api_key_env = "SDK_CHECK_KEY"

[[routes]]
model = "smart"
chain = [{{ provider = "oai", model = "gpt-4o-mini" }}]

[[routes]]
model = "claude"
chain = [{{ provider = "anth", model = "claude-sonnet-4-5" }}]

[[routes]]
model = "embed"
chain = [{{ provider = "oai", model = "text-embedding-3-small" }}]

[[routes]]
model = "broken"
chain = [{{ provider = "oai", model = "upstream-broken" }}]
"""


def check(name, cond, detail=""):
    if not cond:
        print(f"FAIL {name} {detail}", file=sys.stderr)
        sys.exit(1)
    print(f"ok   {name}")


def expect_error(name, kind, status, call):
    try:
        call()
    except kind as e:
        check(name, getattr(e, "status_code", None) == status, f"status {getattr(e, 'status_code', None)}")
        return e
    except Exception as e:  # noqa: BLE001 - any other error is the failure
        check(name, False, f"raised {type(e).__name__}: {e}")
    check(name, False, "no error raised")


def openai_checks(gw):
    client = openai.OpenAI(base_url=f"{gw}/v1", api_key="unused", max_retries=0)
    hi = [{"role": "user", "content": "Hi"}]

    r = client.chat.completions.create(model="smart", messages=hi)
    check("openai: unary", r.choices[0].message.content == "Hello from OpenAI", r)
    check("openai: usage", r.usage.prompt_tokens == 11 and r.usage.completion_tokens == 3, r.usage)
    r = client.chat.completions.create(model="claude", messages=hi)
    check("openai: unary over an Anthropic upstream", r.choices[0].message.content == "Hello from Anthropic", r)

    text, usage = "", None
    for c in client.chat.completions.create(model="smart", messages=hi, stream=True, stream_options={"include_usage": True}):
        if c.choices and c.choices[0].delta.content:
            text += c.choices[0].delta.content
        if c.usage:
            usage = c.usage
    check("openai: streaming", text == "Hello from OpenAI", text)
    check("openai: streamed usage", usage is not None and usage.completion_tokens == 3, usage)
    text = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(model="claude", messages=hi, stream=True) if c.choices)
    check("openai: streaming over an Anthropic upstream", text == "Hello from Anthropic", text)

    tools = [{"type": "function", "function": TOOL}]
    r = client.chat.completions.create(model="smart", messages=[{"role": "user", "content": "Weather in Lyon?"}], tools=tools)
    call = r.choices[0].message.tool_calls[0]
    check("openai: tool call", r.choices[0].finish_reason == "tool_calls" and call.function.name == "weather"
          and json.loads(call.function.arguments) == {"city": "Lyon"}, r)
    args, name = "", None
    for c in client.chat.completions.create(model="smart", messages=[{"role": "user", "content": "Weather in Lyon?"}], tools=tools, stream=True):
        for t in (c.choices[0].delta.tool_calls or []) if c.choices else []:
            name = t.function.name or name
            args += t.function.arguments or ""
    check("openai: streamed tool call", name == "weather" and json.loads(args) == {"city": "Lyon"}, (name, args))

    e = expect_error("openai: an upstream 400 is BadRequestError", openai.BadRequestError, 400,
                     lambda: client.chat.completions.create(model="broken", messages=hi))
    check("openai: the upstream's message is kept", "bad parameter" in str(e), str(e))
    expect_error("openai: an unknown model is NotFoundError", openai.NotFoundError, 404,
                 lambda: client.chat.completions.create(model="nope", messages=hi))

    # The SDK asks for base64 by default and decodes it.
    r = client.embeddings.create(model="embed", input=["alpha", "beta", "gamma"])
    got = [d.embedding for d in r.data]
    check("openai: embeddings (base64)", got == [vector(0), vector(1), vector(2)], got)
    r = client.embeddings.create(model="embed", input="alpha", encoding_format="float")
    check("openai: embeddings (float)", r.data[0].embedding == vector(0), r)
    check("openai: embeddings usage", r.usage.prompt_tokens == 4, r.usage)
    expect_error("openai: embeddings on a route that cannot embed", openai.BadRequestError, 400,
                 lambda: client.embeddings.create(model="claude", input="x"))


def anthropic_checks(gw):
    client = anthropic.Anthropic(base_url=gw, api_key="unused", max_retries=0)
    hi = [{"role": "user", "content": "Hi"}]

    m = client.messages.create(model="smart", max_tokens=64, messages=hi, system="Be brief.")
    check("anthropic: unary over an OpenAI upstream", m.content[0].text == "Hello from OpenAI" and m.stop_reason == "end_turn", m)
    check("anthropic: usage", m.usage.input_tokens == 11 and m.usage.output_tokens == 3, m.usage)
    m = client.messages.create(model="claude", max_tokens=64, messages=hi)
    check("anthropic: unary", m.content[0].text == "Hello from Anthropic", m)

    with client.messages.stream(model="smart", max_tokens=64, messages=hi) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    check("anthropic: streaming over an OpenAI upstream", text == "Hello from OpenAI", text)
    check("anthropic: streamed stop reason and usage", final.stop_reason == "end_turn" and final.usage.output_tokens == 3, final)
    with client.messages.stream(model="claude", max_tokens=64, messages=hi) as s:
        text = "".join(s.text_stream)
    check("anthropic: streaming", text == "Hello from Anthropic", text)

    tools = [{"name": TOOL["name"], "description": TOOL["description"], "input_schema": TOOL["parameters"]}]
    ask = [{"role": "user", "content": "Weather in Lyon?"}]
    m = client.messages.create(model="smart", max_tokens=64, messages=ask, tools=tools)
    use = [b for b in m.content if b.type == "tool_use"]
    check("anthropic: tool call", m.stop_reason == "tool_use" and use and use[0].name == "weather" and use[0].input == {"city": "Lyon"}, m)
    with client.messages.stream(model="smart", max_tokens=64, messages=ask, tools=tools) as s:
        final = s.get_final_message()
    use = [b for b in final.content if b.type == "tool_use"]
    check("anthropic: streamed tool call", final.stop_reason == "tool_use" and use and use[0].input == {"city": "Lyon"}, final)
    # The tool's result goes back, and the answer continues.
    m = client.messages.create(model="smart", max_tokens=64, tools=tools, messages=ask + [
        {"role": "assistant", "content": [{"type": "tool_use", "id": use[0].id, "name": "weather", "input": {"city": "Lyon"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use[0].id, "content": "sunny"}]},
    ])
    check("anthropic: a tool result round trip", m.content[0].text == "Hello from OpenAI", m)

    e = expect_error("anthropic: an upstream 400 is BadRequestError", anthropic.BadRequestError, 400,
                     lambda: client.messages.create(model="broken", max_tokens=64, messages=hi))
    check("anthropic: error in Anthropic's shape", isinstance(e.body, dict) and e.body.get("type") == "error"
          and e.body["error"]["type"] == "invalid_request_error", e.body)
    expect_error("anthropic: an unknown model is NotFoundError", anthropic.NotFoundError, 404,
                 lambda: client.messages.create(model="nope", max_tokens=64, messages=hi))


def main():
    binary = sys.argv[1]
    upstream = ThreadingHTTPServer(("127.0.0.1", 0), Upstream)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    up = f"http://127.0.0.1:{upstream.server_address[1]}"
    port = free_port()
    gw = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as tmp:
        policy = os.path.join(tmp, "policy.toml")
        with open(policy, "w") as f:
            f.write(POLICY.format(up=up))
        env = dict(os.environ, SDK_CHECK_KEY="sk-sdk-check", RUST_LOG="warn")
        proc = subprocess.Popen([binary, "--config", policy, "--listen", f"127.0.0.1:{port}", "--workers", "1"], env=env)
        try:
            for _ in range(200):
                try:
                    urllib.request.urlopen(f"{gw}/health", timeout=1)
                    break
                except OSError:
                    if proc.poll() is not None:
                        check("gateway starts", False, f"exited {proc.returncode}")
                    time.sleep(0.05)
            else:
                check("gateway starts", False, "no /health in 10 s")
            print(f"openai {openai.__version__}, anthropic {anthropic.__version__}")
            openai_checks(gw)
            anthropic_checks(gw)
        finally:
            proc.terminate()
            proc.wait(timeout=10)
            upstream.shutdown()
    print("all SDK checks passed")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Probes the local llama-server started by start.sh: tool calls (plain and
streamed), the answer after a tool result, two tools, a no-tool prompt with tools
attached, a nested `forge_tool` call, and latency. Standard library only.

Usage: python3 scripts/model/probe.py [--base http://127.0.0.1:8089/v1] [--only NAME] [--forge-tries 3]
Exit status is non-zero if a required check (weather, weather_stream, followup,
two_tools) fails; the no-tool and forge_tool probes only report.
"""
import argparse
import http.client
import json
import sys
import time
import urllib.parse

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "City name"}},
            "required": ["city"],
        },
    },
}
CURRENCY = {
    "type": "function",
    "function": {
        "name": "convert_currency",
        "description": "Convert an amount of money from one currency to another",
        "parameters": {
            "type": "object",
            "properties": {
                "amount": {"type": "number"},
                "from": {"type": "string", "description": "ISO currency code"},
                "to": {"type": "string", "description": "ISO currency code"},
            },
            "required": ["amount", "from", "to"],
        },
    },
}
FORGE = {
    "type": "function",
    "function": {
        "name": "forge_tool",
        "description": "Create a new tool. The implementation is JavaScript run in a sandbox: "
        "code must define function execute(input){...} that returns the result.",
        "parameters": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "description": "snake_case tool name"},
                "description": {"type": "string"},
                "inputSchema": {"type": "object", "description": "JSON Schema of the tool input"},
                "implementation": {
                    "type": "object",
                    "properties": {
                        "mode": {"type": "string", "enum": ["sandbox"]},
                        "code": {"type": "string", "description": "function execute(input){...}"},
                    },
                    "required": ["mode", "code"],
                },
                "testCases": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {"input": {"type": "object"}, "expected": {}},
                        "required": ["input", "expected"],
                    },
                },
            },
            "required": ["name", "description", "inputSchema", "implementation", "testCases"],
        },
    },
}
FORGE_PROMPT = (
    "Call forge_tool to create a tool named add_numbers that adds two numbers a and b. "
    "Give it an inputSchema with number properties a and b, implementation mode sandbox with "
    "code 'function execute(input){ return input.a + input.b; }', and one test case."
)


class Client:
    def __init__(self, base):
        u = urllib.parse.urlparse(base)
        self.host, self.port, self.path = u.hostname, u.port or 80, u.path.rstrip("/")

    def post(self, body, stream=False):
        """Returns (status, parsed_json_or_text, timings) or, when streaming,
        (status, list_of_chunks, timings) with first-byte/first-delta times."""
        body = {"model": "qwen", "temperature": 0, **body, "stream": stream}
        conn = http.client.HTTPConnection(self.host, self.port, timeout=300)
        t0 = time.monotonic()
        conn.request("POST", self.path + "/chat/completions", json.dumps(body),
                     {"content-type": "application/json"})
        resp = conn.getresponse()
        t = {"first_byte": time.monotonic() - t0}
        if not stream or resp.status != 200:
            raw = resp.read().decode()
            t["total"] = time.monotonic() - t0
            try:
                return resp.status, json.loads(raw), t
            except ValueError:
                return resp.status, raw, t
        chunks = []
        for line in resp:
            line = line.decode().strip()
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if data == "[DONE]":
                break
            c = json.loads(data)
            chunks.append(c)
            d = (c.get("choices") or [{}])[0].get("delta", {})
            if "first_delta" not in t and (d.get("content") or d.get("tool_calls")):
                t["first_delta"] = time.monotonic() - t0
        t["total"] = time.monotonic() - t0
        return resp.status, chunks, t


def merge_stream(chunks):
    """Reassembles streamed deltas into {content, tool_calls, finish_reason}."""
    content, calls, finish = "", {}, None
    for c in chunks:
        ch = (c.get("choices") or [{}])[0]
        finish = ch.get("finish_reason") or finish
        d = ch.get("delta", {})
        content += d.get("content") or ""
        for tc in d.get("tool_calls") or []:
            cur = calls.setdefault(tc["index"], {"name": "", "arguments": ""})
            f = tc.get("function", {})
            cur["name"] += f.get("name") or ""
            cur["arguments"] += f.get("arguments") or ""
    return {"content": content, "tool_calls": [calls[i] for i in sorted(calls)], "finish_reason": finish}


def calls_of(msg):
    return [{"name": tc["function"]["name"], "arguments": tc["function"]["arguments"]}
            for tc in msg.get("tool_calls") or []]


def user(text):
    return [{"role": "user", "content": text}]


def check_call(calls, name, needle):
    if len(calls) != 1 or calls[0]["name"] != name:
        return False
    try:
        args = json.loads(calls[0]["arguments"])
    except ValueError:
        return False
    return needle.lower() in json.dumps(args).lower()


def validate_forge(args_text):
    """Returns a list of problems with a forge_tool arguments string (empty = valid)."""
    try:
        a = json.loads(args_text)
    except ValueError as e:
        return [f"arguments are not JSON: {e}"]
    problems = []
    for k, typ in [("name", str), ("description", str), ("inputSchema", dict),
                   ("implementation", dict), ("testCases", list)]:
        if not isinstance(a.get(k), typ):
            problems.append(f"{k} missing or not {typ.__name__}")
    impl = a.get("implementation") if isinstance(a.get("implementation"), dict) else {}
    if impl.get("mode") != "sandbox":
        problems.append("implementation.mode != sandbox")
    if "function execute" not in str(impl.get("code", "")):
        problems.append("implementation.code lacks 'function execute'")
    return problems


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", default="http://127.0.0.1:8089/v1")
    ap.add_argument("--only")
    ap.add_argument("--forge-tries", type=int, default=3)
    args = ap.parse_args()
    cl = Client(args.base)
    failed = []

    def report(name, ok, detail, required=True):
        print(f"[{'PASS' if ok else ('FAIL' if required else 'INFO')}] {name}: {detail}", flush=True)
        if required and not ok:
            failed.append(name)

    def want(name):
        return not args.only or args.only == name

    weather_q = user("What is the weather in Oslo?")
    if want("weather"):
        st, r, t = cl.post({"messages": weather_q, "tools": [WEATHER]})
        msg = r["choices"][0]["message"] if st == 200 else {}
        report("weather", st == 200 and check_call(calls_of(msg), "get_weather", "oslo"),
               f"HTTP {st} total {t['total']:.2f}s calls={calls_of(msg)} content={msg.get('content')!r}")
    if want("weather_stream"):
        st, chunks, t = cl.post({"messages": weather_q, "tools": [WEATHER]}, stream=True)
        m = merge_stream(chunks) if st == 200 else {"tool_calls": []}
        report("weather_stream", st == 200 and check_call(m["tool_calls"], "get_weather", "oslo"),
               f"HTTP {st} first_byte {t['first_byte']:.2f}s first_delta {t.get('first_delta', -1):.2f}s "
               f"total {t['total']:.2f}s chunks={len(chunks) if st == 200 else 0} merged={m}")
    if want("followup"):
        msgs = weather_q + [
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "get_weather", "arguments": json.dumps({"city": "Oslo"})}}]},
            {"role": "tool", "tool_call_id": "call_1",
             "content": json.dumps({"city": "Oslo", "temperature_c": 7, "condition": "light rain"})},
        ]
        st, r, t = cl.post({"messages": msgs, "tools": [WEATHER]})
        msg = r["choices"][0]["message"] if st == 200 else {}
        ok = st == 200 and not msg.get("tool_calls") and bool((msg.get("content") or "").strip())
        report("followup", ok, f"HTTP {st} total {t['total']:.2f}s content={msg.get('content')!r}")
        st, chunks, t = cl.post({"messages": msgs, "tools": [WEATHER]}, stream=True)
        m = merge_stream(chunks) if st == 200 else {}
        report("followup_stream", st == 200 and not m["tool_calls"] and bool(m["content"].strip()),
               f"HTTP {st} total {t['total']:.2f}s content={m.get('content')!r}")
    if want("two_tools"):
        for q, name, needle in [("Convert 100 US dollars to euros.", "convert_currency", "usd"),
                                ("What is the weather like in Paris right now?", "get_weather", "paris")]:
            st, r, t = cl.post({"messages": user(q), "tools": [WEATHER, CURRENCY]})
            msg = r["choices"][0]["message"] if st == 200 else {}
            report("two_tools", st == 200 and check_call(calls_of(msg), name, needle),
                   f"{q!r} -> HTTP {st} total {t['total']:.2f}s calls={calls_of(msg)}")
    if want("no_tool"):
        for q in ["Say hello in one short sentence.", "What is 2 + 2?",
                  "Write a haiku about the sea."]:
            for stream in (False, True):
                st, r, t = cl.post({"messages": user(q), "tools": [WEATHER], "max_tokens": 64}, stream=stream)
                if st == 200 and stream:
                    m = merge_stream(r)
                    detail = f"content={m['content']!r} calls={m['tool_calls']}"
                elif st == 200:
                    msg = r["choices"][0]["message"]
                    detail = f"content={msg.get('content')!r} calls={calls_of(msg)}"
                else:
                    detail = f"body={str(r)[:300]}"
                report("no_tool", st == 200, f"{q!r} stream={stream} -> HTTP {st} {t['total']:.2f}s {detail}",
                       required=False)
    if want("forge"):
        ok_n = 0
        for i in range(args.forge_tries):
            # first try greedy, the others sampled so the tries differ
            body = {"messages": user(FORGE_PROMPT), "tools": [FORGE], "max_tokens": 400,
                    "temperature": 0 if i == 0 else 0.7, "seed": 1000 + i}
            st, r, t = cl.post(body)
            msg = r["choices"][0]["message"] if st == 200 and isinstance(r, dict) else {}
            calls = calls_of(msg)
            if st != 200:
                detail = f"HTTP {st} body={str(r)[:300]}"
                ok = False
            elif len(calls) != 1 or calls[0]["name"] != "forge_tool":
                detail = f"no forge_tool call; content={str(msg.get('content'))[:300]!r}"
                ok = False
            else:
                problems = validate_forge(calls[0]["arguments"])
                ok = not problems
                detail = f"problems={problems} arguments={calls[0]['arguments'][:600]}"
            ok_n += ok
            report(f"forge_try{i + 1}", ok, f"total {t['total']:.2f}s {detail}", required=False)
        print(f"forge_tool valid: {ok_n}/{args.forge_tries}")
    if failed:
        print("FAILED:", ", ".join(failed))
        sys.exit(1)
    print("all required checks passed")


if __name__ == "__main__":
    main()

"""bench_online.py — what `medley api` adds to an online request over the worker alone: one
short SmolLM2-135M chat request (temperature 0, --max-tokens tokens, streamed), measured
three ways on one redis-server and one warm `medley worker --model smollm2-135m`, alternating:

- engine: the worker's own timing of the request, from the output line of a direct run
  (queue_ms + prefill_ms is its time to first token, + decode_ms its total): no Redis, no
  HTTP, only the engine and the worker's loop.
- direct (the peer): the request XADDed straight into the online lane P online:{M} by a
  redis-py client that reads P reply:{R} with XREAD BLOCK (docs/protocol.md §9): the worker
  and Redis, without the API. TTFT: XADD to the first delta event; total: to the done event.
- api: the same request as POST /v1/chat/completions with stream: true over a keep-alive
  HTTP connection (http.client): TTFT: request sent to the first content chunk; total: to
  `data: [DONE]`. And without stream: request to the JSON answer.

Prints per way the median TTFT and total over --reps runs, and the API's cost over the
direct path: the difference of the medians (ms) and their ratio. The API's part is its own
work (parse, validation, the EXISTS and XADD, the waiter's XREAD, the chunks) plus one more
hop (HTTP); the model's time is the same in both.

With --model echo (no delay) the model takes no time, and the medians are what each path
itself costs.

Run (Debian 12; medley built in build/; redis-server and redis-py of
scripts/requirements-test.txt; SmolLM2 fetched, scripts/fetch-model.sh):
    python3 bench/api/bench_online.py --medley build/cli/medley [--reps 31] [--max-tokens 16]
    python3 bench/api/bench_online.py --medley build/cli/medley --model echo --reps 301
"""
import argparse
import http.client
import json
import statistics
import time
import uuid

from bench_api import KEY, medley_stack  # this folder's batch bench: the same three processes

MODEL = "smollm2-135m"  # --model
PROMPT = "What is the capital of France? Answer in one sentence."


def body(max_tokens, stream):
    return {"model": MODEL, "messages": [{"role": "user", "content": PROMPT}], "temperature": 0,
            "max_tokens": max_tokens, "stream": stream}


def direct(r, max_tokens):
    """XADD into the online lane, XREAD the reply: (ttft s, total s, text, the done line)."""
    rid = uuid.uuid4().hex[:24]
    line = json.dumps({"custom_id": rid, "method": "POST", "url": "/v1/chat/completions",
                       "body": body(max_tokens, True)})
    key = "medley:reply:{%s}" % rid
    t0 = time.perf_counter()
    r.xadd("medley:online:{%s}" % MODEL, {"reply": rid, "line": line, "deadline": 0,
                                          "tenant": "bench"})
    last, ttft, text = "0-0", None, ""
    while True:
        got = r.xread({key: last}, count=100, block=5000)
        if not got:
            raise SystemExit("no event in 5 s from the worker")
        for eid, f in got[0][1]:
            last = eid
            if f[b"type"] == b"delta":
                if ttft is None:
                    ttft = time.perf_counter() - t0
                text += f[b"text"].decode()
            elif f[b"type"] == b"done":
                total = time.perf_counter() - t0
                r.unlink(key)
                line = json.loads(f[b"line"])
                whole = line["response"]["body"]["choices"][0]["message"]["content"]
                if not whole.startswith(text):
                    raise SystemExit("deltas %r are not the start of %r" % (text, whole))
                return ttft if ttft is not None else total, total, whole, line


def via_api(conn, max_tokens):
    """Streamed through the API: (ttft s, total s, text)."""
    t0 = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", json.dumps(body(max_tokens, True)),
                 {"Authorization": "Bearer " + KEY, "Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise SystemExit("the API answered %d: %s" % (resp.status, resp.read()))
    ttft, text = None, ""
    while True:
        line = resp.readline()
        if not line:
            raise SystemExit("the stream ended without [DONE]")
        if not line.startswith(b"data: "):
            continue
        data = line[6:].strip()
        if data == b"[DONE]":
            total = time.perf_counter() - t0
            resp.read()
            return ttft if ttft is not None else total, total, text
        ch = json.loads(data)
        piece = (ch["choices"][0]["delta"].get("content") or "") if ch["choices"] else ""
        if piece and ttft is None:
            ttft = time.perf_counter() - t0
        text += piece


def via_api_whole(conn, max_tokens):
    t0 = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", json.dumps(body(max_tokens, False)),
                 {"Authorization": "Bearer " + KEY, "Content-Type": "application/json"})
    resp = conn.getresponse()
    doc = json.loads(resp.read())
    if resp.status != 200:
        raise SystemExit("the API answered %d: %s" % (resp.status, doc))
    return time.perf_counter() - t0, doc["choices"][0]["message"]["content"]


def main():
    global MODEL
    ap = argparse.ArgumentParser()
    ap.add_argument("--medley", default="build/cli/medley")
    ap.add_argument("--reps", type=int, default=31)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--model", default=MODEL,
                    help="smollm2-135m, or echo: no model time, only what the paths cost")
    a = ap.parse_args()
    MODEL = a.model
    with medley_stack(a.medley, MODEL, "bench-online-") as st:
        r = st.r
        conn = http.client.HTTPConnection(st.host, st.port, timeout=60)
        for _ in range(300):  # the worker is up once it made its online lane
            if r.exists("medley:online:{%s}" % MODEL):
                break
            time.sleep(0.1)
        direct(r, a.max_tokens)  # warm: the model's pages, the prefix cache
        via_api(conn, a.max_tokens)
        eng_ttft, eng_total, d_ttft, d_total, a_ttft, a_total, w_total = [], [], [], [], [], [], []
        ref = None
        for rep in range(a.reps):
            for way in (("direct", "api", "whole") if rep % 2 == 0 else ("whole", "api", "direct")):
                if way == "direct":
                    t1, t2, text, line = direct(r, a.max_tokens)
                    m = line.get("medley") or {}
                    if not m:
                        raise SystemExit("the worker answered: %s" % line)
                    eng_ttft.append((m["queue_ms"] + m["prefill_ms"]) / 1e3)
                    eng_total.append((m["queue_ms"] + m["prefill_ms"] + m["decode_ms"]) / 1e3)
                    d_ttft.append(t1)
                    d_total.append(t2)
                elif way == "api":
                    t1, t2, text = via_api(conn, a.max_tokens)
                    a_ttft.append(t1)
                    a_total.append(t2)
                else:
                    t2, text = via_api_whole(conn, a.max_tokens)
                    w_total.append(t2)
                if ref is None:
                    ref = text
                elif text != ref:
                    raise SystemExit("temperature 0 gave %r, then %r" % (ref, text))
        med = lambda xs: statistics.median(xs) * 1e3
        print("request: %r, %d tokens at temperature 0 -> %r" % (PROMPT, a.max_tokens, ref))
        print("load average: %s" % open("/proc/loadavg").read().split()[:3])
        print("%-34s %10s %10s" % ("median over %d runs (ms)" % a.reps, "TTFT", "total"))
        print("%-34s %10.1f %10.1f" % ("engine (worker's own timing)", med(eng_ttft),
                                      med(eng_total)))
        print("%-34s %10.1f %10.1f" % ("direct: Redis lane, no API", med(d_ttft), med(d_total)))
        print("%-34s %10.1f %10.1f" % ("api: stream=true", med(a_ttft), med(a_total)))
        print("%-34s %10s %10.1f" % ("api: no stream", "", med(w_total)))
        print("api over direct: TTFT +%.1f ms (%.3fx), total +%.1f ms (%.3fx); "
              "no stream: total +%.1f ms (%.3fx)" % (
                  med(a_ttft) - med(d_ttft), med(a_ttft) / med(d_ttft),
                  med(a_total) - med(d_total), med(a_total) / med(d_total),
                  med(w_total) - med(d_total), med(w_total) / med(d_total)))

if __name__ == "__main__":
    main()

"""plan_routing.py — `medley submit` routes lines to class streams exactly as
docs/protocol.md §3 says: the estimate (ceil(prompt bytes / 4) + max_tokens, from string
contents, text parts or the prompt; max_tokens else max_completion_tokens else 256; a line
that is not JSON counts 256) and the class (smallest max_tokens >= estimate, else the
largest) are computed here independently, from the page, and compared with where medley put
each line. Also: a malformed plan is ignored (lines go to q:{M}), and a plan without classes
for the model routes to q:{M}. No worker runs: the streams are inspected as submitted."""
import json

from harness import *

CLASSES = [("tiny", 20), ("mid", 600), ("big", 3000)]


def doc_estimate(line):
    try:
        body = json.loads(line).get("body")
    except ValueError:
        return 256
    if not isinstance(body, dict):
        return 256

    def content_bytes(c):
        if isinstance(c, str):
            return len(c.encode())
        n = 0
        if isinstance(c, list):
            for p in c:
                t = p if isinstance(p, str) else (p.get("text") if isinstance(p, dict) else None)
                if isinstance(t, str):
                    n += len(t.encode())
        return n

    msgs = body.get("messages")
    if isinstance(msgs, list):
        b = sum(content_bytes(m.get("content")) for m in msgs if isinstance(m, dict))
    else:
        b = content_bytes(body.get("prompt"))
    mt = body.get("max_tokens")
    if not isinstance(mt, int) or isinstance(mt, bool):
        mt = body.get("max_completion_tokens")
    out = mt if isinstance(mt, int) and not isinstance(mt, bool) and mt > 0 else 256
    return (b + 3) // 4 + out


def doc_class(est):
    for name, bound in sorted(CLASSES, key=lambda c: c[1]):
        if bound >= est:
            return name
    return max(CLASSES, key=lambda c: c[1])[0]


def lines():
    out = []

    def add(cid, body, url="/v1/chat/completions"):
        out.append(json.dumps({"custom_id": cid, "method": "POST", "url": url, "body": body}))

    add("a", {"model": "echo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5})
    add("b", {"model": "echo", "messages": [{"role": "user", "content": "é" * 40}],
              "max_tokens": 1})  # 80 bytes: 20 + 1 = 21 -> mid
    add("c", {"model": "echo", "messages": [{"role": "system", "content": "s" * 100},
                                            {"role": "user", "content": [
                                                {"type": "text", "text": "t" * 300}]}],
              "max_tokens": 400})  # 100 + 400 = 500 -> mid
    add("d", {"model": "echo", "messages": [{"role": "user", "content": "x"}]})  # 1 + 256
    add("e", {"model": "echo", "prompt": "p" * 4000, "max_completion_tokens": 10},
        url="/v1/completions")  # 1000 + 10 -> big
    add("f", {"model": "echo", "messages": [{"role": "user", "content": "y" * 40000}],
              "max_tokens": 100})  # beyond every class -> big
    add("g", {"model": "echo", "messages": [{"role": "user", "content": "q"}], "max_tokens": 19})
    add("h", {"model": "echo", "messages": [{"role": "user", "content": "q"}], "max_tokens": 20})
    out.append('{"custom_id": "i", "body": not json')
    add("j", {"model": "echo", "messages": "not a list", "max_tokens": 3})
    return out


def main():
    srv = RedisServer()
    try:
        r = srv.client()
        plan = {"schema_version": 1, "kind": "medley.plan", "version": 7,
                "created_at": "2026-12-02T14:00:00Z", "objective": "max_tokens_per_usd",
                "classes": [{"model": "echo", "name": n, "max_tokens": b} for n, b in CLASSES] +
                           [{"model": "other", "name": "x", "max_tokens": 1}],
                "replicas": [], "models": [], "idle_gpus": [],
                "totals": {"tokens_per_s": 0, "usd_per_hour": 0, "usd_per_mtok": 0,
                           "tokens_per_usd": 0}, "notes": []}
        validate_all(schema_validator("plan"), [plan], "the test plan")
        r.set("medley:plan", json.dumps(plan))
        ls = lines()
        b = submit(srv, write_lines(srv.dir, "in.jsonl", ls), "--model", "echo")
        want = {}
        for l in ls:
            want.setdefault(doc_class(doc_estimate(l)), []).append(l)
        for name, _ in CLASSES:
            got = [f["line"] for _, f in r.xrange("medley:q:{echo}:" + name)]
            if got != want.get(name, []):
                fail("class %s: medley put %s, the docs say %s" % (
                    name, [g[:40] for g in got], [w[:40] for w in want.get(name, [])]))
        if r.xlen("medley:q:{echo}") != 0:
            fail("nothing should go to the plain stream when the plan has classes")
        m = meta(srv, b)
        if m["plan_version"] != "7" or json.loads(m["routing"]) != {
                n: len(want.get(n, [])) for n, _ in CLASSES}:
            fail("meta routing wrong: %s" % m)
        print("routing as documented: %s" % {n: len(v) for n, v in want.items()})

        # A model without classes in the plan, and a broken plan: the plain stream.
        b2 = submit(srv, write_lines(srv.dir, "o.jsonl", [chat_line("o1", "x", model="solo")]))
        if r.xlen("medley:q:{solo}") != 1 or meta(srv, b2)["routing"] != "{}":
            fail("a model without classes must use q:{solo}: %s" % meta(srv, b2))
        r.set("medley:plan", "{not json")
        p = medley("submit", write_lines(srv.dir, "x.jsonl", [chat_line("x1", "x")]),
                   "--redis", srv.url, "--model", "echo")
        if r.xlen("medley:q:{echo}") != 1 or "ignoring the plan" not in p.stderr:
            fail("a broken plan must be ignored with a warning: %s" % p.stderr)
        if meta(srv, p.stdout.strip())["plan_version"] != "-1":
            fail("a broken plan routes nothing: plan_version must be -1")
        print("ok")
    finally:
        srv.stop()


if __name__ == "__main__":
    main()

"""structured_run.py — e2e: structured outputs through `medley run` on SmolLM2 (CPU), the
request side of docs/structured.md in one batch:

- extraction lines over the schemas of structured_cases.py (a subset: one document each
  of N_CASES schemas): every answer that ends with finish_reason "stop" parses and validates
  with Python's jsonschema and its FormatChecker; the share that finished within max_tokens
  is printed;
- json_object, medley.choice and medley.regex lines: their answers are JSON objects, one of
  the choices, matches of the regex; logit_bias +100 on " banana" makes a greedy answer
  " banana banana banana";
- tool calls (tool_choice required and named): the answer's body parses with the openai
  SDK's ChatCompletion type, message.tool_calls names a given function with arguments valid
  against its parameters, finish_reason "tool_calls";
- unsupported fields, tool_choice "auto" (SmolLM2's template has no tool format) and hostile
  schemas ($ref cycle, remote $ref, 10,000-deep nesting, an unsatisfiable strict keyword, a
  50 MB schema): a 400 line each, naming the field, while the other lines of the same batch
  succeed; a second run with --max-line-bytes 16 MiB gives the compiler a 10^6-value enum.

Usage: structured_run.py [--full] [--model M]: --full runs all 200 lines over 20 schemas
(bench/structured/run_e2e.py calls it so) and only reports. Skipped (77) when the model
file or the openai package is missing."""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

from harness import MEDLEY, fail, schema_validator, validate_all
import structured_cases as sc

MODEL_FILES = {"smollm2-135m": "SmolLM2-135M-Instruct.Q4_1.gguf",
               "gemma3-270m": "gemma-3-270m-q4_k_m.gguf"}
# the Gemma 3 GGUF has no tokenizer.chat_template: name medley's built-in one
RUN_ARGS = {"gemma3-270m": ["--chat-template", "gemma"]}


def model_path(name):
    d = os.environ.get("MEDLEY_MODELS") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "medley", "models")
    return os.path.join(d, MODEL_FILES[name])


def run(tmp, name, lines, model, *extra, timeout=600):
    inp, out = os.path.join(tmp, name + ".jsonl"), os.path.join(tmp, name + ".out.jsonl")
    with open(inp, "w") as f:
        for l in lines:
            f.write((l if isinstance(l, str) else json.dumps(l)) + "\n")
    t0 = time.time()
    p = subprocess.run([MEDLEY, "run", inp, "-o", out, "-q"] + RUN_ARGS.get(model, []) +
                       list(extra), capture_output=True,
                       text=True, timeout=timeout, env=dict(os.environ, TMPDIR=tmp))
    if p.returncode not in (0, 1):  # 1: some lines failed, which several here must
        fail("medley run exited %d: %s" % (p.returncode, p.stderr[-2000:]))
    res = {}
    for l in open(out):
        r = json.loads(l)
        res[r["custom_id"]] = r
    return res, time.time() - t0


def status(r):
    return (r.get("response") or {}).get("status_code")


def error_of(r):
    return ((r.get("response") or {}).get("body") or {}).get("error") or r.get("error") or {}


def chat(cid, content, model, **body):
    b = {"model": model, "max_tokens": 32, "temperature": 0,
         "messages": [{"role": "user", "content": content}]}
    b.update(body)
    return {"custom_id": cid, "method": "POST", "url": "/v1/chat/completions", "body": b}


def rf_schema(schema, strict=True):
    return {"type": "json_schema", "json_schema": {"name": "h", "strict": strict,
                                                   "schema": schema}}


def deep_schema(n):
    s = '{"type":"string"}'
    return '{"type":"object","properties":{"a":' * n + s + "}}" * n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--full", action="store_true")
    ap.add_argument("--model", default="smollm2-135m", choices=sorted(MODEL_FILES))
    a = ap.parse_args()
    if not os.path.exists(model_path(a.model)):
        print("SKIP: %s not fetched (scripts/fetch-model.sh)" % model_path(a.model))
        sys.exit(77)
    try:
        import jsonschema
        from openai.types.chat import ChatCompletion
    except ImportError as e:
        print("SKIP: %s (pip install -r scripts/requirements-test.txt)" % e)
        sys.exit(77)
    model = a.model
    tmp = tempfile.mkdtemp(prefix="medley-structured-")
    per_case = 10 if a.full else 1
    cases = sc.CASES if a.full else sc.CASES[:8] + [c for c in sc.CASES if c[0] in ("union",
                                                                                        "tree")]
    lines, expect = [], {}
    for case in cases:
        for i in range(per_case):
            cid = "x-%s-%d" % (case[0], i)
            lines.append(sc.line(cid, case, i, model=model))
            expect[cid] = ("schema", case[1])
    if not a.full:
        lines += [
            chat("obj", "Give a JSON object describing a cat.", model,
                 response_format={"type": "json_object"}),
            chat("choice", "Is the sky blue? Answer yes or no.", model,
                 medley={"choice": ["yes", "no"]}),
            chat("regex", "What year did the war end?", model, medley={"regex": "[12][0-9]{3}"}),
            sc.tool_line("tool-req", "What is the weather in Paris?", model=model),
            sc.tool_line("tool-named", "Mail bob about lunch.", model=model, tool_choice={
                "type": "function", "function": {"name": "send_email"}}),
            chat("tool-none", "Say hi.", model, tools=sc.TOOLS, tool_choice="none"),
        ]
        # logit_bias: +100 on one token makes every greedy step pick it
        tk = subprocess.run([MEDLEY, "tokenize", "-m", model, " banana"], capture_output=True,
                            text=True, timeout=120).stdout.split()
        banana = int(tk[0]) if len(tk) == 2 else None  # one token: "ID\tPIECE"
        if banana is not None:
            lines.append(chat("bias", "Say hi.", model, max_tokens=3,
                              logit_bias={str(banana): 100}))
        bad = {  # custom_id -> (line, the param the 400 names)
            "bad-stream-opts": (chat("b1", "hi", model, stream_options={"include_usage": True}),
                                "body.stream_options"),
            "bad-n": (chat("b2", "hi", model, n=3), "body.n"),
            "bad-unknown": (chat("b3", "hi", model, wibble=1), "body.wibble"),
            "bad-auto": (chat("b4", "hi", model, tools=sc.TOOLS), "body.tool_choice"),
            "bad-bias": (chat("b5", "hi", model, logit_bias={"99999999": 5}), "body.logit_bias"),
            "hostile-cycle": (chat("h1", "hi", model, response_format=rf_schema(
                {"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"})),
                "body.response_format.json_schema.schema"),
            "hostile-remote": (chat("h2", "hi", model, response_format=rf_schema(
                {"$ref": "https://example.com/schema.json"})),
                "body.response_format.json_schema.schema"),
            "hostile-strict": (chat("h3", "hi", model, response_format=rf_schema(
                {"type": "string", "pattern": "(?=a)b"})),
                "body.response_format.json_schema.schema"),
        }
        for cid, (l, _) in bad.items():
            l["custom_id"] = cid
            lines.append(l)
        # 10,000-deep nesting (past the JSON parser's depth bound) and 50 MB: raw text
        deep = ('{"custom_id":"hostile-deep","method":"POST","url":"/v1/chat/completions",'
                '"body":{"model":"%s","messages":[{"role":"user","content":"hi"}],'
                '"response_format":{"type":"json_schema","json_schema":{"name":"d",'
                '"schema":%s}}}}' % (model, deep_schema(10000)))
        big = json.dumps(chat("hostile-50mb", "hi", model, response_format=rf_schema(
            {"type": "object", "description": "x" * (50 << 20)})))
        lines += [deep, big]
        bad["hostile-deep"] = (None, None)
        bad["hostile-50mb"] = (None, None)
    res, secs = run(tmp, "main", lines, model)
    ids = [l["custom_id"] for l in lines if not isinstance(l, str)]
    ids += [] if a.full else ["hostile-deep", "hostile-50mb"]
    missing = set(ids) - set(res)
    if missing:
        fail("no answer for %s" % sorted(missing))
    ok = [r for r in res.values() if status(r) == 200]
    validate_all(schema_validator("output-line"), ok, "output line")

    # extraction: every stop answer validates
    n_stop = n_len = 0
    refused, cut = {}, {}
    fc = jsonschema.FormatChecker()
    for cid, (_, schema) in expect.items():
        r = res[cid]
        err = error_of(r)
        if status(r) == 400 and err.get("code") == "unsupported_value" and \
                err.get("param") == "body.response_format.json_schema.schema":
            # a keyword the compiler does not enforce under strict: true: refused by name,
            # as the contract says; counted, and the case is reported
            refused[cid.rsplit("-", 1)[0]] = err["message"]
            continue
        if status(r) != 200:
            fail("%s: %s" % (cid, json.dumps(r)[:800]))
        ch = r["response"]["body"]["choices"][0]
        text = ch["message"]["content"]
        if ch["finish_reason"] == "length":
            n_len += 1
            cut[cid.rsplit("-", 1)[0][2:]] = cut.get(cid.rsplit("-", 1)[0][2:], 0) + 1
            continue
        if ch["finish_reason"] != "stop":
            fail("%s: finish_reason %s" % (cid, ch["finish_reason"]))
        n_stop += 1
        try:
            jsonschema.validate(json.loads(text), schema, format_checker=fc)
        except Exception as e:  # noqa: BLE001 - any failure is the test's failure
            fail("%s: a stop answer does not validate: %s\n%s" % (cid, e, text))
        if "compile_ms" not in r["medley"] or r["medley"]["schema_relaxed"] != []:
            fail("%s: medley object lacks the constraint report: %s" % (cid, r["medley"]))
    share = n_stop / max(1, n_stop + n_len)
    print("%s: %d extraction lines over %d schemas: %d stop (all validate), %d length: "
          "%.0f%% within max_tokens; %d schema(s) refused under strict; %.1f s for %d lines" % (
              model, len(expect), len(cases), n_stop, n_len, 100 * share, len(refused), secs,
              len(lines)))
    if cut:
        print("  cut by max_tokens: " + ", ".join("%s %d" % kv for kv in sorted(cut.items())))
    for k, m in sorted(refused.items()):
        print("  refused %s: %s" % (k, m[:200]))
    if len(refused) * 2 > len(cases):
        fail("the compiler refused %d of %d schemas" % (len(refused), len(cases)))
    if a.full:
        return
    if n_stop == 0:
        fail("no extraction answer finished within max_tokens")

    def content(cid):
        r = res[cid]
        if status(r) != 200:
            fail("%s: %s" % (cid, json.dumps(r)[:800]))
        return r["response"]["body"]["choices"][0]

    c = content("obj")
    if c["finish_reason"] == "stop" and not isinstance(json.loads(c["message"]["content"]), dict):
        fail("json_object: %r" % c["message"]["content"])
    if content("choice")["message"]["content"] not in ("yes", "no"):
        fail("choice: %r" % content("choice")["message"]["content"])
    c = content("regex")
    if c["finish_reason"] == "stop" and not re.fullmatch("[12][0-9]{3}", c["message"]["content"]):
        fail("regex: %r" % c["message"]["content"])
    for cid, names in (("tool-req", ("get_weather", "send_email")), ("tool-named",
                                                                      ("send_email",))):
        r = res[cid]
        if status(r) != 200:
            fail("%s: %s" % (cid, json.dumps(r)[:800]))
        cc = ChatCompletion.model_validate(r["response"]["body"])
        ch = cc.choices[0]
        if ch.finish_reason == "length":
            print("%s: cut by max_tokens" % cid)
            continue
        if ch.finish_reason != "tool_calls" or ch.message.content is not None:
            fail("%s: %s" % (cid, json.dumps(r["response"]["body"])[:800]))
        call = ch.message.tool_calls[0]
        fn = {t["function"]["name"]: t["function"] for t in sc.TOOLS}
        if call.type != "function" or call.function.name not in names or \
                not call.id.startswith("call_"):
            fail("%s: bad call %s" % (cid, call))
        jsonschema.validate(json.loads(call.function.arguments),
                            fn[call.function.name]["parameters"], format_checker=fc)
        print("%s: %s(%s)" % (cid, call.function.name, call.function.arguments))
    if banana is not None:
        if content("bias")["message"]["content"] != " banana" * 3:
            fail("logit_bias +100 on ' banana' (%d): %r" % (banana,
                                                          content("bias")["message"]["content"]))
        print("bias: %r" % content("bias")["message"]["content"])
    if content("tool-none")["finish_reason"] == "tool_calls":
        fail("tool_choice none made a call")
    for cid, (_, param) in bad.items():
        r = res[cid]
        err = error_of(r)
        if status(r) != 400 or (param and err.get("param") != param):
            fail("%s: expected a 400 naming %s: %s" % (cid, param, json.dumps(r)[:800]))
        print("%s: 400 %s %s: %s" % (cid, err.get("code"), err.get("param"),
                                     (err.get("message") or "")[:150]))

    # a 10^6-value enum, parsed this time (the line is ~8 MB): the compiler's bounds answer
    huge = chat("hostile-enum", "hi", model, response_format=rf_schema(
        {"enum": list(range(1000000))}))
    res2, secs2 = run(tmp, "enum", [huge, chat("after", "Say hi.", model)], model,
                      "--max-line-bytes", str(16 << 20))
    if status(res2.get("hostile-enum", {})) != 400 or status(res2.get("after", {})) != 200:
        fail("10^6 enum: %s / %s" % (json.dumps(res2.get("hostile-enum"))[:600],
                                     json.dumps(res2.get("after"))[:300]))
    print("hostile-enum: 400 %s (run %.1f s)" % (error_of(res2["hostile-enum"]).get("message",
                                                                                    "")[:150],
                                                 secs2))
    print("ok")


main()

"""tools_auto_run.py — e2e: tool_choice "auto" through `medley run` on SmolLM2 served with
`--chat-template hermes` (ChatML plus the Hermes / Qwen2.5 <tool_call> format;
docs/structured.md "tool_choice auto"):

- lines nudged toward a call (logit_bias +6 on the "<" token, parallel_tool_calls false):
  every answer is finish_reason "tool_calls" with exactly one call of a given function whose
  arguments validate against its parameters (jsonschema), and the body parses with the
  openai SDK's ChatCompletion type: the grammar took over once the model wrote <tool_call>;
- the same with parallel_tool_calls true: every call of an answer that finished with
  "tool_calls" is valid, and none has more than 16;
- plain lines (no nudge): text content, no tool_calls, finish "stop" or "length";
- "auto" with a stop string works; "auto" beside response_format is a 400 naming both;
- with `--chat-template llama3-json` (Llama 3.1's bare JSON call {"name", "parameters"}, only
  at the start of the answer): lines nudged toward "{" come back as one valid call each,
  plain ones as text;
- the same "auto" line on the model's own template (no tool format) is a 400 naming
  body.tool_choice.

Skipped (77) when the model file or the openai package is missing."""
import json
import os
import subprocess
import sys
import tempfile

from harness import MEDLEY, fail
MODEL = "smollm2-135m"
LT = 44  # SmolLM2's "<" token: the first of "<tool_call>"
LB = 107  # SmolLM2's "{" token: Llama 3's bare JSON call starts with it
# strings bounded: the nudge toward "<" would otherwise fill an open string with it
S = {"type": "string", "maxLength": 12}
TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather in a city.", "strict": True,
        "parameters": {"type": "object", "additionalProperties": False, "required": ["city"],
                       "properties": {"city": S, "unit": {"enum": ["celsius", "fahrenheit"]}}}}},
    {"type": "function", "function": {
        "name": "send_email", "description": "Send an email.", "strict": True,
        "parameters": {"type": "object", "additionalProperties": False,
                       "required": ["to", "subject"], "properties": {"to": S, "subject": S}}}},
]


def model_path():
    d = os.environ.get("MEDLEY_MODELS") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "medley", "models")
    return os.path.join(d, "SmolLM2-135M-Instruct.Q4_1.gguf")


def line(cid, text, **body):
    b = {"model": MODEL, "max_tokens": 128, "temperature": 0, "tools": TOOLS,
         "messages": [{"role": "user", "content": text}]}
    b.update(body)
    return {"custom_id": cid, "method": "POST", "url": "/v1/chat/completions", "body": b}


def run(tmp, name, lines, *extra):
    inp, out = os.path.join(tmp, name + ".jsonl"), os.path.join(tmp, name + ".out.jsonl")
    with open(inp, "w") as f:
        for l in lines:
            f.write(json.dumps(l) + "\n")
    p = subprocess.run([MEDLEY, "run", inp, "-o", out, "-q"] + list(extra), capture_output=True,
                       text=True, timeout=600, env=dict(os.environ, TMPDIR=tmp))
    if p.returncode not in (0, 1):
        fail("medley run exited %d: %s" % (p.returncode, p.stderr[-2000:]))
    return {r["custom_id"]: r for r in map(json.loads, open(out))}


def body(r):
    return (r.get("response") or {}).get("body") or {}


def check_calls(cid, r, validators, ChatCompletion, most):
    b = body(r)
    ChatCompletion.model_validate(b)  # the SDK's own type
    ch = b["choices"][0]
    calls = ch["message"].get("tool_calls") or []
    if ch["finish_reason"] != "tool_calls" or not 1 <= len(calls) <= most:
        fail("%s: expected 1..%d calls, got %s" % (cid, most, json.dumps(ch)[:400]))
    for c in calls:
        f = c["function"]
        if f["name"] not in validators:
            fail("%s: call of an unknown function %r" % (cid, f["name"]))
        errs = list(validators[f["name"]].iter_errors(json.loads(f["arguments"])))
        if errs:
            fail("%s: arguments %s do not validate: %s" % (cid, f["arguments"], errs[0].message))
        if not c["id"].startswith("call_") or c["type"] != "function":
            fail("%s: call shape %s" % (cid, c))
    return len(calls)


def main():
    if not os.path.exists(model_path()):
        print("tools_auto_run: %s not fetched; skipping" % MODEL)
        return 77
    try:
        from openai.types.chat import ChatCompletion
        import jsonschema
    except ImportError as e:
        print("tools_auto_run: %s; skipping" % e)
        return 77
    validators = {t["function"]["name"]: jsonschema.Draft202012Validator(
        t["function"]["parameters"]) for t in TOOLS}
    asks = ["What's the weather in Paris right now?", "Is it raining in Tokyo?",
            "Email bob@example.com that the meeting moved to 3pm.", "Weather in Berlin, in celsius?"]
    lines = [line("one%d" % i, q, logit_bias={str(LT): 6}, parallel_tool_calls=False)
             for i, q in enumerate(asks)]
    lines += [line("par%d" % i, q, logit_bias={str(LT): 6}) for i, q in enumerate(asks[:2])]
    lines += [line("text0", "Write one sentence about the sea."),
              line("text1", "Say hello.", max_tokens=16),
              line("stop0", "Count from 1 to 9 with spaces.", stop=["5"]),
              line("bad-rf", "hi", response_format={"type": "json_object"})]
    with tempfile.TemporaryDirectory() as tmp:
        res = run(tmp, "auto", lines, "--chat-template", "hermes")
        for i in range(len(asks)):
            check_calls("one%d" % i, res["one%d" % i], validators, ChatCompletion, 1)
        n_par = 0
        for i in range(2):
            r = res["par%d" % i]
            if body(r)["choices"][0]["finish_reason"] == "tool_calls":
                n_par += check_calls("par%d" % i, r, validators, ChatCompletion, 16)
        for cid in ("text0", "text1", "stop0"):
            ch = body(res[cid])["choices"][0]
            if ch["message"].get("tool_calls") or not isinstance(ch["message"]["content"], str) \
                    or ch["finish_reason"] not in ("stop", "length"):
                fail("%s: expected a text answer, got %s" % (cid, json.dumps(ch)[:300]))
        if "5" in body(res["stop0"])["choices"][0]["message"]["content"]:
            fail("stop0: the stop string was not applied")
        r = res["bad-rf"]
        err = body(r).get("error") or {}
        if r["response"]["status_code"] != 400 or "body.tools" not in err.get("message", ""):
            fail("bad-rf: expected a 400 naming both constraints, got %s" % json.dumps(r)[:300])
        l3 = run(tmp, "llama3", [line("l3-%d" % i, q, logit_bias={str(LB): 8})
                                 for i, q in enumerate(asks[:2])] +
                 [line("l3-text", "Say hello.", max_tokens=16)],
                 "--chat-template", "llama3-json")
        for i in range(2):
            check_calls("l3-%d" % i, l3["l3-%d" % i], validators, ChatCompletion, 1)
        ch = body(l3["l3-text"])["choices"][0]
        if ch["message"].get("tool_calls") or not isinstance(ch["message"]["content"], str):
            fail("l3-text: expected a text answer, got %s" % json.dumps(ch)[:300])
        own = run(tmp, "own", [line("own0", "hi")])["own0"]
        err = body(own).get("error") or {}
        if own["response"]["status_code"] != 400 or err.get("param") != "body.tool_choice":
            fail("own template: expected a 400 naming body.tool_choice, got %s"
                 % json.dumps(own)[:300])
    print("tools_auto_run: %d single calls valid, %d parallel calls valid, text and stop lines "
          "plain, 2 llama3-json calls valid, refusals named" % (len(asks), n_par))
    return 0


if __name__ == "__main__":
    sys.exit(main())

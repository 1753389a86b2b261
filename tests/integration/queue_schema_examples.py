"""queue_schema_examples.py — every schema of the queue is a valid Draft 2020-12 schema, and
every example under schemas/examples/ follows its schema (named by the file's prefix); the
input and output schemas refuse what the worker refuses or never emits (sampling extras out of
range, too many alternatives, malformed logprobs and alternatives)."""
import copy
import glob
import json
import os

from harness import SOURCE_DIR, fail, schema_validator, validate_all

NAMES = ["input-line", "output-line", "error-line", "batch-meta", "worker-heartbeat"]


def load(name):
    with open(os.path.join(SOURCE_DIR, "schemas", "examples", name)) as f:
        return json.load(f)


def check_logprob_rules():
    """The sampling extras and logprobs as the worker accepts them (queue/validate.c), and
    the logprobs shapes of output lines."""
    iv, ov = schema_validator("input-line"), schema_validator("output-line")

    def chat(**body):
        b = {"messages": [{"role": "user", "content": "x"}]}
        b.update(body)
        return {"custom_id": "x", "method": "POST", "url": "/v1/chat/completions", "body": b}

    def completion(**body):
        b = {"prompt": "x"}
        b.update(body)
        return {"custom_id": "x", "method": "POST", "url": "/v1/completions", "body": b}

    good = [chat(logprobs=True, top_logprobs=0), chat(logprobs=None, top_logprobs=None),
            chat(logprobs=True, top_logprobs=1), chat(logprobs=True, top_logprobs=20),
            chat(top_k=-1, min_p=0, repetition_penalty=100, frequency_penalty=-2,
                 presence_penalty=2), completion(logprobs=0), completion(logprobs=None),
            completion(logprobs=1), completion(logprobs=5)]
    bad = [chat(logprobs=True, top_logprobs=21), chat(logprobs=True, top_logprobs=-1),
           chat(top_logprobs=0), chat(top_logprobs=3), chat(logprobs=False, top_logprobs=0),
           chat(logprobs=1), completion(logprobs=6), completion(logprobs=-1),
           completion(logprobs=True), chat(frequency_penalty=2.5), chat(presence_penalty=-3),
           chat(top_k=-2), chat(top_k=1.5), chat(min_p=1.5), chat(repetition_penalty=0)]
    for d in good:
        validate_all(iv, [d], "an input line the worker accepts")
    for d in bad:
        if not list(iv.iter_errors(d)):
            fail("input-line schema accepted %s" % json.dumps(d["body"]))
    c, t = load("output-line.chat-logprobs.json"), load("output-line.completion-logprobs.json")
    wrong = []
    d = copy.deepcopy(c)
    d["response"]["body"]["choices"][0]["logprobs"]["content"][0]["logprob"] = 0.5
    wrong.append(("a positive logprob", d))
    d = copy.deepcopy(c)
    d["response"]["body"]["choices"][0]["logprobs"]["content"][0]["top_logprobs"] = None
    wrong.append(("chat top_logprobs null", d))
    d = copy.deepcopy(c)
    d["response"]["body"]["choices"][0]["logprobs"]["content"][0]["bytes"] = [256]
    wrong.append(("a byte of 256", d))
    d = copy.deepcopy(c)
    d["response"]["body"]["choices"][0]["logprobs"] = t["response"]["body"]["choices"][0]["logprobs"]
    wrong.append(("the completions shape in a chat completion", d))
    alt = c["response"]["body"]["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
    for what, alts in (("an alternative without bytes", [{"token": "a", "logprob": -1}]),
                       ("an alternative with a top_logprobs", [dict(alt[0], top_logprobs=[])]),
                       ("a positive alternative", [dict(alt[0], logprob=0.5)]),
                       ("21 alternatives", alt[:1] * 21),
                       ("alternatives as an object", {"a": -1})):
        d = copy.deepcopy(c)
        d["response"]["body"]["choices"][0]["logprobs"]["content"][0]["top_logprobs"] = alts
        wrong.append(("chat: " + what, d))
    for what, tops in (("6 alternatives", [{k: -1.0 for k in "abcdef"}]),
                       ("a positive alternative", [{"a": 0.5}]),
                       ("alternatives as chat's list", [alt]),
                       ("one list for the whole text", {"a": -1.0})):
        d = copy.deepcopy(t)
        d["response"]["body"]["choices"][0]["logprobs"]["top_logprobs"] = tops
        wrong.append(("completions: " + what, d))
    for what, d in wrong:
        if not list(ov.iter_errors(d)):
            fail("output-line schema accepted %s" % what)


def main():
    n = 0
    for name in NAMES:
        v = schema_validator(name)
        examples = sorted(glob.glob(os.path.join(SOURCE_DIR, "schemas", "examples", name + ".*.json")))
        examples += glob.glob(os.path.join(SOURCE_DIR, "schemas", "examples", name + ".json"))
        if not examples:
            fail("no example for schemas/%s.schema.json" % name)
        for path in examples:
            with open(path) as f:
                validate_all(v, [json.load(f)], path)
            n += 1
    # The schemas must also refuse: a wrong document is caught.
    bad = {"custom_id": "x", "method": "GET", "url": "/v1/chat/completions", "body": {"messages": []}}
    if not list(schema_validator("input-line").iter_errors(bad)):
        fail("input-line schema accepted a GET with no messages")
    check_logprob_rules()
    print("ok: %d examples follow their schemas" % n)


main()

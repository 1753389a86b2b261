"""worker_sampling.py — the sampling extras and logprobs of an input line reach the model, and
logprobs come back in OpenAI's shapes (docs/protocol.md section 8, schemas/output-line).

Default (integration, echo model through a real redis-server and `medley worker`): chat
`logprobs: true` gives one entry per byte of the content (logprob 0, exact bytes, U+FFFD for
a part of a character), completions `logprobs: 0` the legacy arrays with text offsets, no
logprobs asked gives null, top_logprobs 3 / completions logprobs 2 list each byte as its own
only alternative (logprob 0), and out-of-range extras are refused with their codes. Every line
follows its schema.

With --engine (e2e, SmolLM2 through `medley run`): on a prompt that makes the model repeat
itself, greedy with a frequency or presence penalty of 2 leaves the unpenalised tokens exactly
where the unpenalised run's own top-20 logprobs say the penalty flips the argmax (a prediction
from the logprobs of the kernels in use, so it holds at every SIMD level), and a repetition
penalty of 3 changes the answer; each equals `medley generate` with the same flags; top_k and min_p at temperature 1.5 give generate's tokens too (top_k 1
and min_p 1 give the greedy ones); logprobs: one entry per completion token (the EOS not
listed), all <= 0, equal to generate --logprobs, tokens and bytes concatenating to the content
(characters split over tokens included), and a stop string cuts the list where it cuts the
text; alternatives (top_logprobs 5 and 20, completions logprobs 3) are as many as asked, most
likely first, equal to generate --top-logprobs within 1e-3 (completions: as text -> logprob,
the more likely of two that read alike), the greedy token first, and listed for the listed
tokens only. Exit 77 (skip) when the model file is not fetched."""
import json
import os
import subprocess
import sys
import tempfile

from harness import *

QUESTION = "List the colors of the rainbow."
# A prompt the model answers by repeating two tokens ("Hello, hello, hello, ..."): a penalty
# on repeated tokens must change that answer on any CPU, not only where a near tie happens to
# fall its way (the rainbow answer on an AVX-512 machine repeats no token the penalty flips).
REPEAT = "Repeat the word hello ten times."
# A question answered in a few tokens and the EOS: the case where the EOS is left out of the
# logprobs.
SHORT = "What is the capital of France? Answer in one word."


def choice(line):
    return line["response"]["body"]["choices"][0]


def content(line):
    c = choice(line)
    return c["message"]["content"] if "message" in c else c["text"]


def check_chat_entries(cid, line, eos, top=0):
    """The chat logprobs of one answer against its content: one entry per token (the EOS left
    out when the answer ended on it), bytes and tokens as the content has them."""
    c, usage = choice(line), line["response"]["body"]["usage"]
    entries = c["logprobs"]["content"]
    want = usage["completion_tokens"] - (1 if eos else 0)
    if len(entries) != want:
        fail("%s: %d logprob entries for %d completion tokens (finish %s, eos %s)" % (
            cid, len(entries), usage["completion_tokens"], c["finish_reason"], eos))
    joined = b"".join(bytes(e["bytes"]) for e in entries)
    if joined != content(line).encode("utf-8"):
        fail("%s: the entries' bytes %r are not the content %r" % (cid, joined, content(line)))
    for e in entries:
        alts = e["top_logprobs"]
        if e["logprob"] > 0 or (top == 0 and alts != []) or len(alts) > top:
            fail("%s: bad entry %s" % (cid, e))
        if any(a["logprob"] > 0 or a["token"] != bytes(a["bytes"]).decode("utf-8", "replace")
               for a in alts) or [a["logprob"] for a in alts] != sorted(
                   [a["logprob"] for a in alts], reverse=True):
            fail("%s: bad alternatives %s" % (cid, alts))
        # the token string: its bytes, each maximal invalid subpart one U+FFFD
        if e["token"] != bytes(e["bytes"]).decode("utf-8", "replace"):
            fail("%s: token %r does not spell its bytes %s" % (cid, e["token"], e["bytes"]))
    return entries


def echo_checks(srv):
    v_ok, v_err = schema_validator("output-line"), schema_validator("error-line")
    cases = {
        "lp-chat": chat_line("lp-chat", "Hello there", logprobs=True, top_logprobs=0),
        "lp-utf8": chat_line("lp-utf8", "h\u00e9\u20ac", logprobs=True),
        "lp-cut": chat_line("lp-cut", "abcdef", logprobs=True, max_tokens=4),
        "lp-none": chat_line("lp-none", "no logprobs"),
        "lp-false": chat_line("lp-false", "no logprobs", logprobs=False),
        "lp-cmp": json.dumps({"custom_id": "lp-cmp", "method": "POST", "url": "/v1/completions",
                              "body": {"model": "echo", "prompt": "one two. three",
                                       "logprobs": 0, "stop": "."}}),
        "lp-top3": chat_line("lp-top3", "t\u00e9p", logprobs=True, top_logprobs=3),
        "cmp-lp2": json.dumps({"custom_id": "cmp-lp2", "method": "POST", "url": "/v1/completions",
                               "body": {"model": "echo", "prompt": "ab", "logprobs": 2}}),
        "extras": chat_line("extras", "penalised", frequency_penalty=1.5, presence_penalty=-1,
                            repetition_penalty=1.3, top_k=-1, min_p=0.1),
    }
    refused = {
        "top21": (chat_line("top21", "x", logprobs=True, top_logprobs=21), "invalid_value",
                  "body.top_logprobs"),
        "top-alone": (chat_line("top-alone", "x", top_logprobs=0), "invalid_value",
                      "body.top_logprobs"),
        "lp-int": (chat_line("lp-int", "x", logprobs=1), "invalid_type", "body.logprobs"),
        "cmp-lp6": (json.dumps({"custom_id": "cmp-lp6", "method": "POST",
                                "url": "/v1/completions",
                                "body": {"model": "echo", "prompt": "x", "logprobs": 6}}),
                    "invalid_value", "body.logprobs"),
        "freq": (chat_line("freq", "x", frequency_penalty=2.5), "invalid_value",
                 "body.frequency_penalty"),
        "topk": (chat_line("topk", "x", top_k=-3), "invalid_value", "body.top_k"),
        "minp": (chat_line("minp", "x", min_p="high"), "invalid_type", "body.min_p"),
        "rep": (chat_line("rep", "x", repetition_penalty=0), "invalid_value",
                "body.repetition_penalty"),
    }
    path = write_lines(srv.dir, "echo.jsonl", list(cases.values()) + [v[0] for v in refused.values()])
    batch = submit(srv, path, "--model", "echo")
    w = Worker(srv, name="w-echo")
    try:
        m = wait_batch(srv, batch, timeout=60)
        out = {l["custom_id"]: l for l in results(srv, batch)}
    finally:
        w.stop()
    if int(m["completed"]) != len(cases) or int(m["failed"]) != len(refused):
        fail("meta counts wrong: %s" % m)
    for cid, (_, code, param) in refused.items():
        err = out[cid]["response"]["body"]["error"]
        if err["code"] != code or err["param"] != param:
            fail("%s: expected %s on %s, got %s" % (cid, code, param, err))
        validate_all(v_err, [out[cid]], "error line " + cid)
    validate_all(v_ok, [out[c] for c in cases], "output line")

    for cid in ("lp-chat", "lp-utf8", "lp-cut"):
        entries = check_chat_entries(cid, out[cid], eos=False)
        if any(e["logprob"] != 0 or len(e["bytes"]) != 1 for e in entries):
            fail("%s: an echo token is one certain byte: %s" % (cid, entries))
    if "".join(e["token"] for e in choice(out["lp-chat"])["logprobs"]["content"]) != "Hello there":
        fail("lp-chat: tokens do not spell the content")
    # h, then the two bytes of é, then the three of €: every byte its own token
    toks = [e["token"] for e in choice(out["lp-utf8"])["logprobs"]["content"]]
    if toks != ["h"] + ["\ufffd"] * 5:
        fail("lp-utf8: tokens %r" % toks)
    if content(out["lp-cut"]) != "abcd" or choice(out["lp-cut"])["finish_reason"] != "length":
        fail("lp-cut: %s" % choice(out["lp-cut"]))
    for cid in ("lp-none", "lp-false", "extras"):
        if choice(out[cid])["logprobs"] is not None:
            fail("%s: logprobs not asked for, got %s" % (cid, choice(out[cid])["logprobs"]))
    if content(out["extras"]) != "penalised":
        fail("extras: %s" % choice(out["extras"]))
    lp = choice(out["lp-cmp"])["logprobs"]
    want = {"tokens": list("one two"), "token_logprobs": [0.0] * 7, "top_logprobs": None,
            "text_offset": list(range(7))}
    if content(out["lp-cmp"]) != "one two" or lp != want:
        fail("lp-cmp: %s" % choice(out["lp-cmp"]))
    # alternatives: an echo byte is certain, so its only alternative is itself at 0
    for e in check_chat_entries("lp-top3", out["lp-top3"], eos=False, top=3):
        if e["top_logprobs"] != [{"token": e["token"], "logprob": 0.0, "bytes": e["bytes"]}]:
            fail("lp-top3: alternatives %s" % e)
    lp = choice(out["cmp-lp2"])["logprobs"]
    if lp["top_logprobs"] != [{"a": 0.0}, {"b": 0.0}] or lp["tokens"] != ["a", "b"]:
        fail("cmp-lp2: %s" % lp)
    print("ok: echo logprobs and alternatives in both shapes, %d bad extras refused" % len(refused))


# ---- the real engine ----------------------------------------------------------------------


def model_path():
    d = os.environ.get("MEDLEY_MODELS") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "medley", "models")
    return os.path.join(d, "SmolLM2-135M-Instruct.Q4_1.gguf")


def generate(*flags, chat=QUESTION, prompt=None, n=40):
    """`medley generate --json` on the question (or a raw prompt), greedy unless flags say
    otherwise."""
    what = ["-p", prompt] if prompt is not None else ["--chat", chat]
    p = medley("generate", "-m", "smollm2-135m", *what, "-n", n, "--json", *flags, timeout=300)
    return json.loads(p.stdout.strip().splitlines()[-1])


def predict_flip(g, frequency, presence, eps=0.01):
    """Where greedy with these output-token penalties (docs/engine.md: a token already generated
    c times loses presence + frequency * c) first parts from the unpenalised greedy run g
    (generate --json --top-logprobs 20): the index of the first token it changes, -1 if it
    changes none, None where the list cannot tell (a near tie within eps, or the best
    penalised candidate below what a token outside the list could reach). Logprobs of one step
    differ from its logits by one constant, so comparing them compares the logits."""
    counts = {}
    for i, (tok, alts) in enumerate(zip(g["tokens"], g["top_logprobs"])):
        floor = min(a["logprob"] for a in alts)  # anything unlisted is at or below it
        score = {a["id"]: a["logprob"] - ((presence + frequency * counts[a["id"]])
                                          if counts.get(a["id"]) else 0) for a in alts}
        ranked = sorted(score.items(), key=lambda kv: -kv[1])
        if ranked[0][1] < floor + eps or ranked[0][1] - ranked[1][1] < eps:
            return None
        if ranked[0][0] != tok:
            return i
        counts[tok] = counts.get(tok, 0) + 1
    return -1


def same_alternatives(cid, got, want, tol=1e-3):
    """A token's alternatives against generate's, both [(key, logprob)] most likely first: the
    same logprobs in the same order within tol, and a key in both at the same logprob in both.
    A key only one side lists must be within tol of the other side's last (a near tie at the
    edge of the list can fall either way between two runs' logits)."""
    if len(got) != len(want) or any(abs(a[1] - b[1]) > tol for a, b in zip(got, want)):
        fail("%s: alternatives %s, generate's %s" % (cid, got, want))
    for side, other in ((dict(got), dict(want)), (dict(want), dict(got))):
        edge = min(other.values()) if other else 0
        for k, x in side.items():
            if abs(x - other.get(k, edge)) > tol:
                fail("%s: %r at %g, the other list %s" % (cid, k, x, other))


def engine_checks():
    if not os.path.exists(model_path()):
        print("SKIP: %s not fetched (scripts/fetch-model.sh)" % model_path())
        sys.exit(77)
    tmp = tempfile.mkdtemp(prefix="medley-sampling-")

    def chat(cid, text=QUESTION, **body):
        b = {"temperature": 0, "max_tokens": 40}
        b.update(body)
        return chat_line(cid, text, model="smollm2-135m", **b)

    def completion(cid, prompt, **body):
        b = {"model": "smollm2-135m", "prompt": prompt, "temperature": 0, "max_tokens": 24}
        b.update(body)
        return json.dumps({"custom_id": cid, "method": "POST", "url": "/v1/completions",
                           "body": b})

    lines = [
        chat("plain"),
        chat("plain-lp", logprobs=True),
        chat("plain-top", logprobs=True, top_logprobs=5),
        chat("eos-lp", SHORT, max_tokens=64, logprobs=True),
        chat("repeat", REPEAT),
        chat("freq", REPEAT, frequency_penalty=2.0, logprobs=True),
        chat("freq-top", REPEAT, frequency_penalty=2.0, logprobs=True, top_logprobs=20),
        chat("pres", REPEAT, presence_penalty=2.0),
        chat("rep", REPEAT, repetition_penalty=3.0),
        chat("hot", temperature=1.5, seed=11),
        chat("hot-k5", temperature=1.5, seed=11, top_k=5),
        chat("hot-minp", temperature=1.5, seed=11, min_p=0.1),
        chat("hot-k1", temperature=1.5, seed=11, top_k=1),
        chat("hot-minp1", temperature=1.5, seed=11, min_p=1.0),
        chat("emoji", "Emoji: \U0001F600\U0001F600\U0001F600\U0001F600", max_tokens=24,
             logprobs=True),
        completion("cmp-lp", "Count: one, two, three,", logprobs=0),
        completion("cmp-top", "Count: one, two, three,", logprobs=3),
        completion("cmp-emoji", "Emoji: \U0001F600\U0001F600\U0001F600\U0001F600", logprobs=0),
        completion("cut-mid", "The capital of France is", logprobs=0, stop="aris"),
        completion("cut-edge", "The capital of France is", logprobs=0, stop=" Paris"),
        completion("cut-late", "The capital of France is", logprobs=0, stop="."),
        completion("cut-mid-top", "The capital of France is", logprobs=2, stop="aris"),
    ]
    inp, outp = os.path.join(tmp, "in.jsonl"), os.path.join(tmp, "out.jsonl")
    with open(inp, "w") as f:
        f.write("\n".join(lines) + "\n")
    p = subprocess.run([MEDLEY, "run", inp, "-o", outp], capture_output=True, text=True,
                       timeout=600, env=dict(os.environ, TMPDIR=tmp))
    if p.returncode != 0:
        fail("medley run: %s" % p.stderr)
    with open(outp) as f:
        out = {l["custom_id"]: l for l in map(json.loads, f)}
    if len(out) != len(lines) or any(l["error"] or l["response"]["status_code"] != 200
                                     for l in out.values()):
        fail("not every line answered: %s" % json.dumps(out)[:2000])
    validate_all(schema_validator("output-line"), list(out.values()), "output line")

    # penalties: generate's continuation with the same flags, changed exactly where the
    # unpenalised run's logprobs say the penalty flips the argmax
    plain = content(out["plain"])
    base = generate("--top-logprobs", "20", chat=REPEAT)
    if base["text"] != content(out["repeat"]):
        fail("repeat: worker %r, generate %r" % (content(out["repeat"]), base["text"]))
    most = max(base["tokens"].count(t) for t in set(base["tokens"]))
    if most < 5:
        fail("repeat: the answer %r repeats no token 5 times; the penalty cases prove nothing"
             % base["text"])
    for cid, flags, freq, pres in (("freq", ["--frequency-penalty", "2"], 2.0, 0.0),
                                   ("pres", ["--presence-penalty", "2"], 0.0, 2.0),
                                   ("rep", ["--repeat-penalty", "3"], None, None)):
        g = generate(*flags, chat=REPEAT)
        if content(out[cid]) != g["text"]:
            fail("%s: worker %r, generate %s %r" % (cid, content(out[cid]), flags, g["text"]))
        if freq is None:  # the repetition penalty divides logits: not predictable from logprobs
            if g["text"] == base["text"]:
                fail("%s: the penalty changed nothing: %r" % (cid, base["text"]))
            continue
        at = predict_flip(base, freq, pres)
        if at is None or at < 0:
            fail("%s: the unpenalised logprobs predict %s; the case proves nothing: %r" % (
                cid, "no flip" if at == -1 else "a near tie", base["text"]))
        if g["tokens"][:at] != base["tokens"][:at] or g["tokens"][at] == base["tokens"][at]:
            fail("%s: predicted to keep %d tokens and change token %d (%d), got %s vs %s" % (
                cid, at, at, base["tokens"][at], g["tokens"][:at + 1], base["tokens"][:at + 1]))
        print("%s: parts from the unpenalised answer at token %d, as its logprobs predict" % (cid, at))
    # the draw's filters: generate's tokens with the same flags; a filter keeping only the
    # most likely token makes the hot draw greedy
    hot = content(out["hot"])
    if hot == plain:
        fail("hot: temperature 1.5 drew the greedy tokens; the filter checks would prove nothing")
    for cid, flags in (("hot", []), ("hot-k5", ["--top-k", "5"]),
                       ("hot-minp", ["--min-p", "0.1"])):
        g = generate("--temp", "1.5", "--seed", "11", *flags)
        if content(out[cid]) != g["text"]:
            fail("%s: worker %r, generate %s %r" % (cid, content(out[cid]), flags, g["text"]))
    if content(out["hot-k5"]) == hot or content(out["hot-minp"]) == hot:
        fail("top_k 5 / min_p 0.1 changed nothing at temperature 1.5: %r" % hot)
    for cid in ("hot-k1", "hot-minp1"):
        if content(out[cid]) != plain:
            fail("%s: %r is not the greedy %r" % (cid, content(out[cid]), plain))

    # logprobs: asking for them changes no token; they are generate's; EOS is not listed
    if content(out["plain-lp"]) != plain:
        fail("plain-lp: logprobs changed the tokens: %r" % content(out["plain-lp"]))
    for cid, text, flags in (("plain-lp", QUESTION, []), ("eos-lp", SHORT, ["-n", "64"]),
                             ("freq", REPEAT, ["--frequency-penalty", "2"])):
        line = out[cid]
        eos = choice(line)["finish_reason"] == "stop"
        entries = check_chat_entries(cid, line, eos)
        if "".join(e["token"] for e in entries) != content(line):
            fail("%s: tokens do not spell the content" % cid)
        g = generate("--logprobs", *flags, chat=text)
        if len(g["logprobs"]) != line["response"]["body"]["usage"]["completion_tokens"]:
            fail("%s: generate made %d tokens" % (cid, len(g["logprobs"])))
        worst = max(abs(a["logprob"] - b) for a, b in zip(entries, g["logprobs"]))
        if worst > 1e-3:
            fail("%s: logprobs differ from generate's by %g" % (cid, worst))
    if choice(out["eos-lp"])["finish_reason"] != "stop":
        fail("eos-lp was to end on the EOS (the case where it is left out): %s"
             % choice(out["eos-lp"]))
    # characters split over tokens: bytes rejoin them, tokens show U+FFFD (the chat answer to
    # emoji may be text; the completion of four emoji continues them on any CPU)
    entries = check_chat_entries("emoji", out["emoji"], choice(out["emoji"])["finish_reason"] == "stop")
    split = lambda toks: any(t == "\ufffd" for t in toks)
    if not split(e["token"] for e in entries) and \
            not split(choice(out["cmp-emoji"])["logprobs"]["tokens"]):
        fail("emoji, cmp-emoji: no token holds part of a character; the case is not exercised")

    # completions: one entry per token, offsets into the text
    for cid in ("cmp-lp", "cmp-emoji"):
        c = choice(out[cid])
        lp, text = c["logprobs"], content(out[cid]).encode("utf-8")
        n = out[cid]["response"]["body"]["usage"]["completion_tokens"]
        if c["finish_reason"] != "length" or not (
                len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["text_offset"]) == n):
            fail("%s: %d completion tokens, logprobs %s" % (cid, n, lp))
        if lp["top_logprobs"] is not None or any(x > 0 for x in lp["token_logprobs"]):
            fail("%s: %s" % (cid, lp))
        offs = lp["text_offset"]
        if offs[0] != 0 or offs != sorted(offs) or offs[-1] >= len(text):
            fail("%s: offsets %s in %d bytes" % (cid, offs, len(text)))
    lp = choice(out["cmp-lp"])["logprobs"]
    if "".join(lp["tokens"]) != content(out["cmp-lp"]):
        fail("cmp-lp: tokens do not spell the text")
    at = [sum(len(t.encode()) for t in lp["tokens"][:i]) for i in range(len(lp["tokens"]))]
    if lp["text_offset"] != at:
        fail("cmp-lp: offsets %s, expected %s" % (lp["text_offset"], at))

    # stop strings: tokens beginning before the cut are listed whole, later ones not
    cuts = {"cut-mid": (" P", [" Paris"]), "cut-edge": ("", []), "cut-late": (" Paris", [" Paris"])}
    for cid, (text, toks) in cuts.items():
        c = choice(out[cid])
        if content(out[cid]) != text or c["logprobs"]["tokens"] != toks or \
                c["finish_reason"] != "stop" or c["logprobs"]["text_offset"] != [0] * len(toks):
            fail("%s: expected %r with tokens %s, got %s" % (cid, text, toks, c))
    if out["cut-late"]["response"]["body"]["usage"]["completion_tokens"] != 2:
        fail("cut-late: the '.' token was to be generated and left out: %s" % out["cut-late"])
    # alternatives: as many as asked, most likely first, generate --top-logprobs's; asking for
    # them changes no token and no logprob; greedy without penalties picks the first
    if content(out["plain-top"]) != plain or content(out["freq-top"]) != content(out["freq"]):
        fail("plain-top / freq-top: alternatives changed the tokens")
    for cid, ref, k, text, flags in (("plain-top", "plain-lp", 5, QUESTION, []),
                                     ("freq-top", "freq", 20, REPEAT, ["--frequency-penalty", "2"])):
        line = out[cid]
        entries = check_chat_entries(cid, line, choice(line)["finish_reason"] == "stop", top=k)
        g = generate("--top-logprobs", str(k), *flags, chat=text)
        refs = choice(out[ref])["logprobs"]["content"]
        for i, (e, r) in enumerate(zip(entries, refs)):
            alts = e["top_logprobs"]
            if len(alts) != k or abs(e["logprob"] - r["logprob"]) > 1e-6:
                fail("%s: entry %s (without alternatives %s)" % (cid, e, r))
            same_alternatives("%s token %d" % (cid, i),
                              [(bytes(a["bytes"]), a["logprob"]) for a in alts],
                              [(bytes(a["bytes"]), a["logprob"]) for a in g["top_logprobs"][i]])
            # the chosen token, where listed, at its own logprob
            for a in alts:
                if a["bytes"] == e["bytes"] and abs(a["logprob"] - e["logprob"]) > 1e-6:
                    fail("%s: token %s listed at %g" % (cid, e, a["logprob"]))
        if cid == "plain-top" and any(e["top_logprobs"][0]["bytes"] != e["bytes"]
                                      for e in entries):
            fail("plain-top: greedy without penalties did not pick the most likely: %s" % entries)
    # the penalty moved the choice off the raw argmax somewhere: the lists are the raw logits'
    if all(e["top_logprobs"][0]["bytes"] == e["bytes"]
           for e in choice(out["freq-top"])["logprobs"]["content"]):
        fail("freq-top: the penalised tokens are all the raw argmax; the case proves nothing")
    # completions: one object per listed token, text -> logprob, generate's lists as text
    lp = choice(out["cmp-top"])["logprobs"]
    if content(out["cmp-top"]) != content(out["cmp-lp"]) or \
            len(lp["top_logprobs"]) != len(lp["tokens"]) or \
            lp["token_logprobs"] != choice(out["cmp-lp"])["logprobs"]["token_logprobs"]:
        fail("cmp-top: %s" % lp)
    g = generate("--top-logprobs", "3", prompt="Count: one, two, three,", n=24)
    for i, (tok, x, alts) in enumerate(zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"])):
        want = {}
        for a in g["top_logprobs"][i]:  # the first of two that read alike: the more likely
            want.setdefault(bytes(a["bytes"]).decode("utf-8", "replace"), a["logprob"])
        by_lp = lambda d: sorted(d.items(), key=lambda kv: -kv[1])
        same_alternatives("cmp-top token %d %r" % (i, tok), by_lp(alts), by_lp(want))
        if abs(max(alts.values()) - x) > 1e-6:
            fail("cmp-top: greedy token %r at %g is not the most likely of %s" % (tok, x, alts))
    c = choice(out["cut-mid-top"])["logprobs"]
    if c["tokens"] != [" Paris"] or len(c["top_logprobs"]) != 1 or \
            abs(c["top_logprobs"][0].get(" Paris", 1) - c["token_logprobs"][0]) > 1e-6:
        fail("cut-mid-top: alternatives for the listed tokens only: %s" % c)
    print("ok: penalties, top_k and min_p as generate; logprobs and alternatives of %d answers"
          % len(out))


def main():
    if "--engine" in sys.argv:
        engine_checks()
        return
    srv = RedisServer()
    try:
        echo_checks(srv)
    finally:
        srv.stop()


main()

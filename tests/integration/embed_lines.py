#!/usr/bin/env python3
"""/v1/embeddings batch lines end to end (docs/embeddings.md, docs/protocol.md §8).

A random BERT written as a sentence-transformers directory (embed_reference.py) is served by
`medley run`: answers are OpenAI's (object "list", data[i] {object, index, embedding}, model,
usage counting every token), float and base64 agree, vectors equal the numpy reference
(cosine >= 0.9999). Hostile lines get a 400 naming the field, and the good lines of the same
batch are answered anyway: 2,049 inputs, a 10 MB string, nested arrays, ids of 2^40 and past
the vocabulary, empty inputs, too long (the limit named) and medley.truncate, dimensions on a
model without Matryoshka training, a chat line on an embedding model, a text line when the
model's tokenizer.json has an unknown model type. A model card tagged
matryoshka honours dimensions (cut, renormalised). Then one `medley worker` serving the
embedding model and the echo model at once answers both batches, every custom_id once.
Needs numpy, redis-server, the medley binary (MEDLEY_BIN); seconds.
"""
import base64
import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import embed_reference as ref  # noqa: E402
import harness  # noqa: E402

MEDLEY = os.environ["MEDLEY_BIN"]
failures = []


def check(ok, what, out=""):
    print("%s: %s" % ("ok" if ok else "FAIL", what))
    if not ok:
        failures.append(what)
        print(str(out)[-1500:])


def line(cid, inp, **body):
    b = {"input": inp}
    b.update(body)
    return json.dumps({"custom_id": cid, "method": "POST", "url": "/v1/embeddings", "body": b})


def run(d, lines, tmp):
    src = os.path.join(tmp, "in.jsonl")
    out = os.path.join(tmp, "out.jsonl")
    with open(src, "w") as f:
        f.write("\n".join(lines) + "\n")
    p = subprocess.run([MEDLEY, "run", "-m", d, src, "-o", out], capture_output=True, text=True,
                       timeout=300)
    if p.returncode not in (0, 1):
        check(False, "medley run exited %d" % p.returncode, p.stderr)
        return {}
    return {j["custom_id"]: j for j in map(json.loads, open(out))}


def vec(e):
    if isinstance(e, str):
        b = base64.b64decode(e)
        return np.array(struct.unpack("<%df" % (len(b) // 4), b))
    return np.array(e)


def err_of(ans):
    r = ans.get("response") or {}
    return r.get("status_code"), json.dumps((r.get("body") or {}).get("error") or ans.get("error"))


def good_lines(cfg, t, ins, res):
    want = [ref.pool(ref.bert_hidden(cfg, t, i), "mean", True) for i in ins]
    a, b, c = res["one"], res["many"], res["b64"]
    body = (a.get("response") or {}).get("body") or {}
    check(a["response"]["status_code"] == 200 and body.get("object") == "list"
          and body["data"][0]["object"] == "embedding" and body["data"][0]["index"] == 0
          and body.get("model") and body["usage"] == {"prompt_tokens": 3, "total_tokens": 3},
          "one token-id input: OpenAI's body and usage", a)
    got = [vec(d["embedding"]) for d in sorted(b["response"]["body"]["data"], key=lambda d: d["index"])]
    check(len(got) == 4 and min(ref.cosines(got, want)) >= 0.9999
          and b["response"]["body"]["usage"]["prompt_tokens"] == sum(map(len, ins)),
          "four inputs in one line equal the numpy reference, in index order", b)
    g64 = [vec(d["embedding"]) for d in c["response"]["body"]["data"]]
    # float answers are written with 9 significant digits: each float32 exactly
    check(len(g64) == len(got) and all(np.array_equal(x.astype(np.float32), y.astype(np.float32))
                                       for x, y in zip(g64, got)),
          "base64 (little-endian float32) equals float, every value exactly", c)
    return ins


def hostile_lines(res):
    expect = {
        "too-many": ("body.input", "2048"), "huge": (None, "line"), "nested": ("body.input[0]", "token id"),
        "id-2^40": ("body.input", "1099511627776"), "oov": ("body.input", "vocabulary"),
        "empty-str": ("body.input", "empty string"), "empty-arr": ("body.input", "empty array"),
        "too-long": ("body.input", "at most 64"), "dims": ("body.dimensions", "Matryoshka"),
        "chat": ("url", "embedding model"), "field": ("body.temperature", "not a parameter"),
        "fmt": ("body.encoding_format", "base64"),
    }
    for cid, (param, words) in expect.items():
        a = res.get(cid)
        status, err = err_of(a) if a else (None, "no answer")
        ok = a is not None and status in (400, None) and words in err
        if param:
            ok = ok and json.loads(err).get("param") == param
        check(ok, "%s: refused naming %s" % (cid, param or "the line size"), err)


def main():
    rng = np.random.default_rng(7)
    cfg, t = ref.random_bert(rng)
    with tempfile.TemporaryDirectory() as tmp:
        d = os.path.join(tmp, "bert")
        ref.write_st(d, cfg, t, "mean", True)
        with open(os.path.join(d, "tokenizer.json"), "w") as f:  # a model type no one runs
            json.dump({"version": "1.0", "model": {"type": "Unigram2", "vocab": []}}, f)
        ins = [rng.integers(1, cfg["vocab_size"], size=n).tolist() for n in (3, 17, 64, 1)]
        long_ids = list(range(1, 70))
        lines = [line("one", ins[0]), line("many", ins), line("b64", ins, encoding_format="base64"),
                 line("too-many", [[1, 2]] * 2049), line("huge", "x" * (10 << 20)),
                 line("nested", [[[1]]]), line("id-2^40", [1, 2 ** 40]), line("oov", [[1, 500]]),
                 line("empty-str", ""), line("empty-arr", []), line("too-long", long_ids),
                 line("cut", long_ids, medley={"truncate": True}, user="u"),
                 line("dims", [1, 2], dimensions=8), line("field", [1], temperature=0),
                 line("fmt", [1], encoding_format="int8"), line("text", "hello"),
                 json.dumps({"custom_id": "chat", "method": "POST", "url": "/v1/chat/completions",
                             "body": {"messages": [{"role": "user", "content": "hi"}]}})]
        res = run(d, lines, tmp)
        check(sorted(res) == sorted(json.loads(l)["custom_id"] for l in lines),
              "every line answered once (%d)" % len(res), sorted(res))
        if not res:
            return 1
        good_lines(cfg, t, ins, res)
        ok_v, err_v = harness.schema_validator("output-line"), harness.schema_validator("error-line")
        bad = [c for c, a in res.items()
               if list((ok_v if a["error"] is None and a["response"]["status_code"] == 200 else err_v)
                       .iter_errors(a))]
        check(not bad, "answers follow output-line / error-line schemas", bad)
        hostile_lines(res)
        st, err = err_of(res["text"])
        check("tokenizer" in err and "Unigram2" in err and "token ids" in err,
              "a text line on a model whose tokenizer.json has an unknown model type: a clear "
              "error (token-id lines of the batch answered)", err)
        cut = res["cut"]["response"]["body"]["data"][0]["embedding"]
        want = ref.pool(ref.bert_hidden(cfg, t, long_ids[:64]), "mean", True)
        check(ref.cosines([np.array(cut)], [want])[0] >= 0.9999,
              "medley.truncate cuts at max_seq_length (64)", res["cut"])
        m = os.path.join(tmp, "mat")
        ref.write_st(m, cfg, t, "mean", True)
        open(os.path.join(m, "README.md"), "w").write("---\ntags:\n- matryoshka\n---\n# card\n")
        res = run(m, [line("full", ins[1]), line("cut16", ins[1], dimensions=16)], tmp)
        full = np.array(res["full"]["response"]["body"]["data"][0]["embedding"])
        c16 = np.array(res["cut16"]["response"]["body"]["data"][0]["embedding"])
        check(len(c16) == 16 and np.allclose(c16, full[:16] / np.linalg.norm(full[:16]), atol=1e-6),
              "Matryoshka: dimensions 16 is the first 16, renormalised", res["cut16"])
        mixed(d, ins, tmp)
        precision(d, ins, tmp)
    print("%d failure(s)" % len(failures))
    return 1 if failures else 0


def precision(d, ins, tmp):
    """--embed-precision bf16: vectors near the F32 ones where the CPU has AVX512-BF16, else a
    clear refusal naming BF16; any other value is refused naming the flag."""
    src = os.path.join(tmp, "p.jsonl")
    with open(src, "w") as f:
        f.write("\n".join(line("p%d" % i, ins[i % 4]) for i in range(8)) + "\n")
    outs = {}
    for prec in ("f32", "bf16", "fp8"):
        out = os.path.join(tmp, "p-%s.jsonl" % prec)
        p = subprocess.run([MEDLEY, "run", "-m", d, src, "-o", out, "--embed-precision", prec],
                           capture_output=True, text=True, timeout=300)
        outs[prec] = (p, out)
    p, out = outs["fp8"]
    check(p.returncode != 0 and "--embed-precision fp8" in p.stderr,
          "--embed-precision fp8 is refused naming the flag", p.stderr)
    p, out = outs["bf16"]
    if p.returncode != 0:
        check("BF16" in p.stderr, "--embed-precision bf16 refused clearly on this CPU", p.stderr)
        return
    def vecs(path):
        return {j["custom_id"]: vec(j["response"]["body"]["data"][0]["embedding"])
                for j in map(json.loads, open(path))}
    f32, bf = vecs(outs["f32"][1]), vecs(out)
    cos = min(float(np.dot(f32[k], bf[k]) / np.linalg.norm(f32[k]) / np.linalg.norm(bf[k]))
              for k in f32)
    check(len(bf) == 8 and cos >= 0.999 and any(not np.array_equal(f32[k], bf[k]) for k in f32),
          "--embed-precision bf16: BF16 products, cosine to F32 >= 0.999 (min %.6f)" % cos)


def mixed(d, ins, tmp):
    """One worker serving an embedding model and a generation model (echo) answers both."""
    env = dict(os.environ, MEDLEY_MODELS=os.path.join(tmp, "models"))
    os.environ["MEDLEY_MODELS"] = env["MEDLEY_MODELS"]
    p = subprocess.run([MEDLEY, "models", "add", "tiny-bert", d], capture_output=True, text=True)
    check(p.returncode == 0, "models add takes a sentence-transformers directory", p.stderr)
    server = harness.RedisServer()
    w = harness.Worker(server, models=("tiny-bert", "echo"), env=env)
    try:
        e = harness.write_lines(tmp, "e.jsonl", [line("e%d" % i, ins[i % 4]) for i in range(40)])
        g = harness.write_lines(tmp, "g.jsonl", [harness.chat_line("g%d" % i, "hi %d" % i) for i in range(40)])
        be = harness.submit(server, e, "--model", "tiny-bert")
        bg = harness.submit(server, g, "--model", "echo")
        harness.wait_batch(server, be, 120)
        harness.wait_batch(server, bg, 120)
        re, rg = harness.results(server, be), harness.results(server, bg)
        harness.exactly_once(re, ["e%d" % i for i in range(40)])
        harness.exactly_once(rg, ["g%d" % i for i in range(40)])
        check(all(r["response"]["status_code"] == 200 for r in re + rg)
              and all(r["response"]["body"]["object"] == "list" for r in re),
              "one worker, an embedding and a generation model: 80 lines answered once", (re + rg)[:2])
    finally:
        w.stop()
        server.stop()


if __name__ == "__main__":
    sys.exit(main())

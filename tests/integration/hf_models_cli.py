#!/usr/bin/env python3
"""`medley models add` refuses what `medley generate` refuses, on transformers-made HF
directories (tests/fixtures/hf, tests/fixtures/hf/make_hf_tiny.py) broken four ways: a shape
mismatch, a missing tensor, a tokenizer larger than the output head, a broken tokenizer.json.
Also: `models inspect` names an HF directory's tokenizer, the unknown-model error lists the
added models, an HF Mistral slides past its window (a prompt of 92 tokens, window 8),
`medley run` documents -m and takes a GGUF path with it. Needs the medley binary and
redis-server (for run); seconds.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

MEDLEY = os.environ["MEDLEY_BIN"]
SOURCE_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HF = os.path.join(SOURCE_DIR, "tests", "fixtures", "hf")
GGUF = os.path.join(SOURCE_DIR, "tests", "fixtures", "engine", "tiny-mistral-swa.gguf")
failures, passes = [], []


def medley(env, *args):
    p = subprocess.run([MEDLEY, *args], capture_output=True, text=True, timeout=120, env=env)
    return p.returncode, p.stdout + p.stderr


def check(ok, what, out=""):
    print("%s: %s" % ("ok" if ok else "FAIL", what))
    (passes if ok else failures).append(what)
    if not ok:
        print(out[-1500:])


def broken(tmp, name, edit):
    d = os.path.join(tmp, name)
    shutil.copytree(os.path.join(HF, "tiny-mistral"), d)
    edit(d)
    return d


def edit_json(path, fn):
    with open(path) as f:
        j = json.load(f)
    fn(j)
    with open(path, "w") as f:
        json.dump(j, f)


def main():
    tmp = tempfile.mkdtemp(prefix="medley-hf-cli-")
    env = dict(os.environ, TMPDIR=tmp, MEDLEY_MODELS=os.path.join(tmp, "models"),
               MEDLEY_LOG_LEVEL="warn")
    try:
        cases = [
            ("shape", lambda d: edit_json(os.path.join(d, "config.json"),
                                          lambda j: j.update(intermediate_size=64)),
             "blk.0.ffn_gate.weight has shape"),
            ("missing", lambda d: edit_json(os.path.join(d, "config.json"),
                                            lambda j: j.update(num_hidden_layers=3)),
             "lacks tensor blk.2."),
            ("vocab", lambda d: edit_json(
                os.path.join(d, "tokenizer.json"),
                lambda j: j["added_tokens"].append(
                    {"id": 300, "content": "<extra>", "single_word": False, "lstrip": False,
                     "rstrip": False, "normalized": False, "special": True})),
             "tokenizer has 301 tokens, the output head 300"),
            ("tokenizer", lambda d: open(os.path.join(d, "tokenizer.json"), "w").write("{\"model\":"),
             "tokenizer.json"),
        ]
        for name, edit, want in cases:
            d = broken(tmp, name, edit)
            rc, out = medley(env, "generate", "-m", d, "-p", "ta", "-n", "1")
            check(rc != 0 and want in out, "generate refuses %s (%s)" % (name, want), out)
            rc, out = medley(env, "models", "add", "bad-" + name, d)
            check(rc != 0 and want in out, "models add refuses %s (%s)" % (name, want), out)
        rc, out = medley(env, "models", "add", "tiny", os.path.join(HF, "tiny-mistral"))
        check(rc == 0, "models add accepts the good directory", out)
        rc, out = medley(env, "models", "inspect", "tiny")
        check(rc == 0 and re.search(r"tokenizer +hf-char / pre tokenizer.json", out),
              "models inspect names the HF tokenizer", out)
        rc, out = medley(env, "models", "inspect", "tiny", "--json")
        check(rc == 0 and json.loads(out).get("tokenizer") == "hf-char",
              "models inspect --json names the HF tokenizer", out)
        rc, out = medley(env, "models", "inspect", "no-such-model")
        check(rc != 0 and "added: tiny" in out, "the unknown-model error lists added models", out)
        prompt = " ".join(["ta ea hello ot"] * 4)  # 92 tokens, window 8, context 256
        rc, out = medley(env, "generate", "-m", "tiny", "-p", prompt, "-n", "2", "--json")
        j = json.loads(out[out.index("{"):]) if rc == 0 else {}
        check(rc == 0 and j.get("prompt_tokens", 0) > 58,
              "HF Mistral takes a prompt past its window (%s tokens)" % j.get("prompt_tokens"),
              out)
        rc, out = medley(env, "run", "--help")
        check(rc == 0 and "-m, --model" in out, "run --help names -m", out)
        if not shutil.which("redis-server"):
            print("skip: run -m PATH needs redis-server")
        else:
            inp, res = os.path.join(tmp, "in.jsonl"), os.path.join(tmp, "out.jsonl")
            with open(inp, "w") as f:
                f.write(json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/completions",
                                    "body": {"prompt": "ta ea", "max_tokens": 2}}) + "\n")
            rc, out = medley(env, "run", inp, "-o", res, "-m", GGUF, "--quiet")
            lines = [json.loads(l) for l in open(res)] if rc == 0 else []
            check(rc == 0 and len(lines) == 1 and
                  lines[0]["response"]["status_code"] == 200,
                  "run -m FILE.gguf answers", out + (json.dumps(lines)[:800] if lines else ""))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("%d passed, %d failed" % (len(passes), len(failures)))
    sys.exit(1 if failures else 0)


main()

"""hf_run_smollm2.py — e2e: `medley models add` an HF directory (SmolLM2-135M as BF16
safetensors, made by tests/fixtures/hf/make_hf_smollm2.py into $MEDLEY_HF_DIR, with the
tokenizer.json that tests/fixtures/tokenizer/make_hf_tokenizer.py builds with the `tokenizers`
package from the GGUF vocabulary), then `medley run` a batch of 4 documents of
examples/summarize.jsonl on it (CPU): every document gets a non-empty answer with usage, and
every line follows schemas/output-line. Skipped (exit 77) when SmolLM2 is not fetched.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

from harness import MEDLEY, SOURCE_DIR, fail, schema_validator, validate_all


def model_path():
    d = os.environ.get("MEDLEY_MODELS") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "medley", "models")
    return os.path.join(d, "SmolLM2-135M-Instruct.Q4_1.gguf")


def main():
    gguf = model_path()
    hf = os.environ.get("MEDLEY_HF_DIR", "")
    if not os.path.exists(gguf):
        print("SKIP: %s not fetched (scripts/fetch-model.sh)" % gguf)
        sys.exit(77)
    if not os.path.exists(os.path.join(hf, "model.safetensors")):
        fail("no HF directory at MEDLEY_HF_DIR=%r (the hf_smollm2_make fixture makes it)" % hf)
    tmp = tempfile.mkdtemp(prefix="medley-hf-run-")
    try:
        tok = os.path.join(tmp, "tok")
        p = subprocess.run([sys.executable, os.path.join(SOURCE_DIR, "tests", "fixtures",
                                                         "tokenizer", "make_hf_tokenizer.py"),
                            tok, gguf], capture_output=True, text=True, timeout=300)
        if p.returncode != 0:
            fail("make_hf_tokenizer.py: %s" % p.stderr[-2000:])
        model = os.path.join(tmp, "SmolLM2-hf")
        os.makedirs(model)
        for f in ("config.json", "model.safetensors"):
            os.symlink(os.path.join(hf, f), os.path.join(model, f))
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(os.path.join(tok, "smollm2", f), model)
        env = dict(os.environ, TMPDIR=tmp, MEDLEY_MODELS=os.path.join(tmp, "models"))
        p = subprocess.run([MEDLEY, "models", "add", "smollm2-hf", model], capture_output=True,
                           text=True, timeout=120, env=env)
        if p.returncode != 0:
            fail("medley models add: %s" % p.stderr)
        lines = []
        with open(os.path.join(SOURCE_DIR, "examples", "summarize.jsonl")) as f:
            for l in [l for l in f if l.strip()][:4]:
                j = json.loads(l)
                j["body"]["model"] = "smollm2-hf"
                lines.append(json.dumps(j) + "\n")
        inp, out = os.path.join(tmp, "in.jsonl"), os.path.join(tmp, "out.jsonl")
        with open(inp, "w") as f:
            f.writelines(lines)
        p = subprocess.run([MEDLEY, "run", inp, "-o", out], capture_output=True, text=True,
                           timeout=600, env=env)
        if p.returncode != 0:
            fail("medley run: %s" % p.stderr)
        res = [json.loads(l) for l in open(out)]
        if sorted(r["custom_id"] for r in res) != sorted(json.loads(l)["custom_id"] for l in lines):
            fail("custom_ids differ")
        validate_all(schema_validator("output-line"), res, "output line")
        for r in res:
            body = r["response"]["body"]
            text = body["choices"][0]["message"]["content"]
            if not text.strip() or body["usage"]["completion_tokens"] < 1:
                fail("bad answer: %s" % json.dumps(r)[:600])
            print("%s: %s" % (r["custom_id"], text.replace("\n", " ")[:120]))
        print("ok: %s" % p.stderr.strip().splitlines()[-1])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


main()

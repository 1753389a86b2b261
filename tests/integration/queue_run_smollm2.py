"""queue_run_smollm2.py — e2e: `medley run` on the first 6 documents of
examples/summarize.jsonl with the real engine and SmolLM2-135M (CPU): every document gets a
non-empty summary with usage and timings, and every line follows schemas/output-line.
Skipped (exit 77) when the model file is not fetched (scripts/fetch-model.sh)."""
import json
import os
import subprocess
import sys
import tempfile

from harness import MEDLEY, SOURCE_DIR, fail, schema_validator, validate_all


def model_path():
    d = os.environ.get("MEDLEY_MODELS") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "medley", "models")
    return os.path.join(d, "SmolLM2-135M-Instruct.Q4_1.gguf")


def main():
    if not os.path.exists(model_path()):
        print("SKIP: %s not fetched (scripts/fetch-model.sh)" % model_path())
        sys.exit(77)
    tmp = tempfile.mkdtemp(prefix="medley-e2e-")
    with open(os.path.join(SOURCE_DIR, "examples", "summarize.jsonl")) as f:
        lines = [l for l in f if l.strip()][:6]
    inp = os.path.join(tmp, "in.jsonl")
    out = os.path.join(tmp, "out.jsonl")
    with open(inp, "w") as f:
        f.writelines(lines)
    p = subprocess.run([MEDLEY, "run", inp, "-o", out, "--usd-per-hour", "1.0"], capture_output=True,
                       text=True, timeout=600, env=dict(os.environ, TMPDIR=tmp))
    if p.returncode != 0:
        fail("medley run: %s" % p.stderr)
    res = [json.loads(l) for l in open(out)]
    if sorted(r["custom_id"] for r in res) != sorted(json.loads(l)["custom_id"] for l in lines):
        fail("custom_ids differ")
    validate_all(schema_validator("output-line"), res, "output line")
    for r in res:
        body = r["response"]["body"]
        text = body["choices"][0]["message"]["content"]
        u = body["usage"]
        if not text.strip() or u["completion_tokens"] < 1 or u["completion_tokens"] > 48:
            fail("bad answer: %s" % json.dumps(r)[:600])
        if r["medley"]["decode_ms"] <= 0 or r["medley"]["cost_usd"] <= 0:
            fail("timings/cost missing: %s" % r["medley"])
        print("%s: %s" % (r["custom_id"], text.replace("\n", " ")[:120]))
    print("ok: %s" % p.stderr.strip().splitlines()[-1])


main()

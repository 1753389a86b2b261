#!/usr/bin/env python3
"""`medley profile` writes a profile the scheduler can read: run it on the CPU backend with
SmolLM2-135M (tiny sizes, a few seconds), validate the document against
schemas/profile.schema.json, and check every measured figure is a positive number for
every (batch, context) point asked for. With MEDLEY_PROFILE_DEVICE=cuda:0 the same check
runs on a GPU (tests/gpu/run-device-check.sh does). Exits 77 (skip) without the model.

Usage: MEDLEY_BIN=build/cli/medley python3 tests/gpu/check_profile.py
"""
import json
import os
import subprocess
import sys
import tempfile

import jsonschema

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def model_path():
    d = os.environ.get("MEDLEY_MODELS")
    if not d:
        cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        d = os.path.join(cache, "medley", "models")
    p = os.path.join(d, MODEL_FILE)
    return p if os.path.exists(p) else None


def main():
    model = model_path()
    if not model:
        print(f"SKIP: {MODEL_FILE} not found (scripts/fetch-model.sh fetches it)")
        return 77
    binary = os.environ.get("MEDLEY_BIN", os.path.join(ROOT, "build", "cli", "medley"))
    device = os.environ.get("MEDLEY_PROFILE_DEVICE", "cpu")
    batches, contexts = [1, 3], [24, 40]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "profile.json")
        cmd = [binary, "profile", "-m", model, "--device", device, "--batches",
               ",".join(map(str, batches)), "--contexts", ",".join(map(str, contexts)),
               "--gen", "4", "--model-name", "smollm2-135m", "-o", out]
        if device == "cpu":
            cmd += ["-t", "2"]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        sys.stderr.write(r.stderr)
        if r.returncode != 0:
            print(f"FAIL: {' '.join(cmd)} exited {r.returncode}")
            return 1
        doc = json.load(open(out))
    schema = json.load(open(os.path.join(ROOT, "schemas", "profile.schema.json")))
    jsonschema.validate(doc, schema, format_checker=jsonschema.FormatChecker())
    assert doc["method"] == "measured" and doc["model"] == "smollm2-135m", doc
    assert doc["quant"] == "Q4_1", doc["quant"]
    assert doc["device_type"] == "CPU" if device == "cpu" else doc["device_type"] != "CPU"
    points = {(p["batch"], p["context"]) for p in doc["batches"]}
    want = {(b, c + 2) for b in batches for c in contexts}
    assert points == want, (points, want)
    for p in doc["batches"]:
        for k in ("prefill_tokens_per_s", "decode_tokens_per_s", "decode_step_ms"):
            assert p[k] > 0, (k, p)
    print(f"profile on {device}: valid, {len(doc['batches'])} points")
    print(json.dumps(doc["batches"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())

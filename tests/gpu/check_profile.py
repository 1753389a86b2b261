#!/usr/bin/env python3
"""`medley profile` writes a profile the scheduler reads: run it on the CPU backend with
SmolLM2-135M (tiny sizes, a few seconds), validate the document against
schemas/profile.schema.json, check every measured figure is a positive number for every
(batch, context) point asked for, then plan one GPU of the profile's type with `medley
plan` without and with `--profile`: with it, the replica's prediction must come from the
profile ("bound": "profile") and differ from the roofline's. On CPU the profile is labelled
H200 (--device-type), which is what makes the scheduler apply it; with
MEDLEY_PROFILE_DEVICE=cuda:0 (tests/gpu/run-device-check.sh) the type comes from the GPU,
or from MEDLEY_PROFILE_DEVICE_TYPE when set. MEDLEY_PROFILE_MODEL profiles another model
(the device check's rehearsal on the CPU emulator: a synthetic one, its quantization then
not checked). Exits 77 (skip) without the model.

Usage: MEDLEY_BIN=build/cli/medley python3 tests/gpu/check_profile.py
"""
import json
import os
import subprocess
import sys
import tempfile

try:
    import jsonschema
except ImportError:  # CI installs it (scripts/requirements-test.txt); a bare GPU image may not
    jsonschema = None

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
    model = os.environ.get("MEDLEY_PROFILE_MODEL") or model_path()
    other_model = bool(os.environ.get("MEDLEY_PROFILE_MODEL"))
    dtype = os.environ.get("MEDLEY_PROFILE_DEVICE_TYPE")
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
            dtype = dtype or "H200"
        if dtype:
            cmd += ["--device-type", dtype]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        sys.stderr.write(r.stderr)
        if r.returncode != 0:
            print(f"FAIL: {' '.join(cmd)} exited {r.returncode}")
            return 1
        doc = json.load(open(out))
    schema = json.load(open(os.path.join(ROOT, "schemas", "profile.schema.json")))
    if jsonschema:
        jsonschema.validate(doc, schema, format_checker=jsonschema.FormatChecker())
    else:
        print("jsonschema is not installed: schema validation skipped, field checks only")
        assert set(schema["required"]) <= set(doc) and set(doc) <= set(schema["properties"])
    assert doc["method"] == "measured" and doc["model"] == "smollm2-135m", doc
    assert other_model or doc["quant"] == "Q4_1", doc["quant"]
    assert doc["device_type"] == dtype if dtype else doc["device_type"] != "CPU"
    # the batch sweep at the first context, batch sizes increasing (the scheduler needs it)
    assert [(p["batch"], p["context"]) for p in doc["batches"]] == \
        [(b, contexts[0] + 2) for b in batches], doc["batches"]
    for p in doc["batches"]:
        for k in ("prefill_tokens_per_s", "decode_tokens_per_s", "decode_step_ms"):
            assert p[k] > 0, (k, p)
    # one bucket per context, input ranges adjacent and holding their context
    bk = doc["buckets"]
    assert len(bk) == len(contexts), bk
    for i, (b, c) in enumerate(zip(bk, contexts)):
        assert b["input_lo"] <= c < b["input_hi"] and b["input_mean"] == c, b
        assert i == 0 or b["input_lo"] == bk[i - 1]["input_hi"], bk
        assert b["max_output_tokens_per_s"] > 0 and b["batch"] in batches, b
    print(f"profile on {device}: valid, {len(doc['batches'])} batch points, {len(bk)} buckets")
    print(json.dumps(doc["batches"]))
    print(json.dumps(bk))
    return check_plan(binary, doc, out_text=json.dumps(doc))


def check_plan(binary, doc, out_text):
    catalog = json.load(open(os.path.join(ROOT, "scheduler", "catalog", "gpus.json")))
    gpus = catalog.get("gpus", catalog) if isinstance(catalog, dict) else catalog
    names = {g.get("name") for g in gpus if isinstance(g, dict)}
    if doc["device_type"] not in names:
        print(f"plan check skipped: {doc['device_type']} is not in the GPU catalog")
        return 0
    fleet = {"version": 1, "kind": "medley.fleet", "name": "one-gpu",
             "pools": [{"name": "g", "type": doc["device_type"], "count": 1, "gpus_per_host": 1}]}
    workload = {"version": 1, "kind": "medley.workload", "seed": 1,
                "models": [{"model": "smollm2-135m", "requests": 1000, "priority": 1,
                            "classes": [{"name": "short", "input_mean": 30, "output_mean": 8,
                                         "max_tokens": 64, "share": 1.0}]}]}
    with tempfile.TemporaryDirectory() as tmp:
        paths = {}
        for name, obj in (("fleet", fleet), ("workload", workload)):
            paths[name] = os.path.join(tmp, name + ".json")
            json.dump(obj, open(paths[name], "w"))
        prof = os.path.join(tmp, "profile.json")
        open(prof, "w").write(out_text)
        plans = []
        for extra in ([], ["--profile", prof]):
            out = os.path.join(tmp, f"plan{len(plans)}.json")
            r = subprocess.run([binary, "plan", "--fleet", paths["fleet"], "--workload",
                                paths["workload"], "--json", "-o", out] + extra,
                               capture_output=True, text=True, timeout=120)
            if r.returncode != 0:
                print(f"FAIL: medley plan {' '.join(extra)} exited {r.returncode}: {r.stderr}")
                return 1
            plans.append(json.load(open(out)))
    cls = [p["replicas"][0]["per_class"]["short"] for p in plans]
    assert cls[0]["bound"] != "profile", cls[0]
    assert cls[1]["bound"] == "profile", cls[1]
    assert cls[0]["tokens_per_s"] != cls[1]["tokens_per_s"], cls
    print(f"plan: roofline {cls[0]['tokens_per_s']:.1f} tokens/s, with the profile "
          f"{cls[1]['tokens_per_s']:.1f} tokens/s (bound: profile)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""test_sched_schemas.py — the scheduler's schemas (gpu-catalog, fleet, model-card, workload,
plan, profile) are valid Draft 2020-12 schemas; their examples, the built-in GPU catalog and
the plans `medley plan --json` emits follow them; wrong documents are refused.
Run by ctest with MEDLEY_BIN set to the medley binary."""
import glob
import json
import os
import subprocess
import sys

import jsonschema
from referencing import Registry, Resource

SRC = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
NAMES = ["gpu-catalog", "fleet", "model-card", "workload", "plan", "profile"]


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def load(path):
    with open(path) as f:
        return json.load(f)


schemas = {n: load(os.path.join(SRC, "schemas", n + ".schema.json")) for n in NAMES}
registry = Registry().with_resources(
    [(s["$id"], Resource.from_contents(s)) for s in schemas.values()])


def validator(name):
    s = schemas[name]
    jsonschema.Draft202012Validator.check_schema(s)
    return jsonschema.Draft202012Validator(s, registry=registry,
                                           format_checker=jsonschema.FormatChecker())


def check(name, doc, where):
    errs = sorted(validator(name).iter_errors(doc), key=lambda e: list(e.path))
    if errs:
        fail("%s does not follow schemas/%s.schema.json: %s at %s" %
             (where, name, errs[0].message, list(errs[0].path)))


n = 0
for name in NAMES:
    for i, ex in enumerate(schemas[name].get("examples", [])):
        check(name, ex, "%s example %d" % (name, i))
        n += 1
    paths = glob.glob(os.path.join(SRC, "schemas", "examples", name + ".*.json"))
    paths += glob.glob(os.path.join(SRC, "schemas", "examples", name + ".json"))
    for p in paths:
        check(name, load(p), p)
        n += 1
    if name != "gpu-catalog" and not paths:
        fail("no example file for schemas/%s.schema.json" % name)

catalog = load(os.path.join(SRC, "scheduler", "catalog", "gpus.json"))
check("gpu-catalog", catalog, "scheduler/catalog/gpus.json")
for g in catalog["gpus"]:
    src = g.get("sources", {})
    if not src.get("spec", "").startswith("https://") or "https://" not in src.get("price", ""):
        fail("catalog entry %s lacks a spec or price source URL" % g["name"])
names = {g["name"] for g in catalog["gpus"]}
for need in ["H200", "H100-SXM", "H100-PCIe", "A100-80GB-SXM", "A100-40GB", "L40S", "L4", "A10G",
             "T4", "RTX-4090", "RTX-3090", "RTX-6000-Ada"]:
    if need not in names:
        fail("catalog lacks %s" % need)

for w in glob.glob(os.path.join(SRC, "bench", "scheduler", "workload-*.json")):
    check("workload", load(w), w)
    n += 1
for f in glob.glob(os.path.join(SRC, "bench", "scheduler", "fleet-*.json")):
    check("fleet", load(f), f)
    n += 1

# Refusals: a fleet with both pools and rent, a plan stage without layers, a profile with
# neither buckets nor batches.
bad = [("fleet", {"pools": [{"type": "L4", "count": 1}], "rent": {"types": ["L4"]}}),
       ("workload", {"models": [{"model": "llama-3-8b", "requests": 5}]}),
       ("profile", {"version": 1, "kind": "medley.profile", "device_type": "L4", "model": "m",
                    "date": "2026-01-01T00:00:00Z", "method": "measured"})]
for name, doc in bad:
    if not list(validator(name).iter_errors(doc)):
        fail("schemas/%s.schema.json accepted %s" % (name, json.dumps(doc)))

# Plans the binary emits.
binary = os.environ.get("MEDLEY_BIN")
if binary and os.path.exists(binary):
    ex = os.path.join(SRC, "schemas", "examples")
    cases = [("fleet.mixed.json", "workload.mixed.json"), ("fleet.rent.json", "workload.mixed.json")]
    for fl, wl in cases:
        out = subprocess.run([binary, "plan", "--fleet", os.path.join(ex, fl), "--workload",
                              os.path.join(ex, wl), "--json"], capture_output=True, text=True)
        if out.returncode != 0:
            fail("medley plan %s %s: %s" % (fl, wl, out.stderr))
        check("plan", json.loads(out.stdout), "medley plan --json (%s, %s)" % (fl, wl))
        n += 1
    bad = subprocess.run([binary, "plan", "--fleet", os.path.join(ex, "workload.mixed.json"),
                          "--workload", os.path.join(ex, wl)], capture_output=True, text=True)
    if bad.returncode != 1 or "pools" not in bad.stderr:
        fail("a workload given as the fleet should fail with a message about pools: %r" % bad.stderr)
else:
    print("note: MEDLEY_BIN not set; emitted plans not checked")
# docs/sharding.md's hand-written plan (issue 39 item 14) follows the plan schema.
with open(os.path.join(SRC, "docs", "sharding.md")) as f:
    md = f.read()
at = md.find("<!-- plan example:")
if at < 0:
    fail("docs/sharding.md has no plan example")
block = md[md.index("```json\n", at) + 8:]
check("plan", json.loads(block[:block.index("```")]), "docs/sharding.md plan example")
n += 1
print("ok: %d scheduler documents follow their schemas" % n)

"""sched_bad_input.py — `medley plan` on hostile planner inputs (issue 26 item 5), against the
schema examples (schemas/examples: fleet.mixed, fleet.rent, workload.mixed, profile.measured):

1. every object of every document, given a key its schema does not list (the schemas forbid
   unknown keys), and `deadline` for `deadline_s`: the schema refuses it (checked with
   jsonschema) and so does `medley plan`, naming the key — before, it was silently ignored;
2. figures of 1e308 (a fleet price, a pool's price, a GPU type's TFLOPS and memory, a catalog
   GPU) and profiles of 1e308 and 1e100 requests/s: a clear error, never an abort inside
   GLPK (exit 134, "Assertion failed: teta >= 0.0") nor a plan of 0 replicas that claims
   its demand served.
Each case must exit 1 with the field in the message; the unmodified examples must plan."""
import copy
import json
import os
import subprocess
import sys
import tempfile

import jsonschema
from referencing import Registry, Resource

from harness import MEDLEY, SOURCE_DIR, fail

EX = os.path.join(SOURCE_DIR, "schemas", "examples")
SKIP = {"prices", "sources"}  # maps whose keys are names (GPU types; price/spec sources)


def load(name):
    with open(os.path.join(EX, name + ".json")) as f:
        return json.load(f)


def schema_validators(names):
    """Draft 2020-12 validators, with the schemas that reference each other registered."""
    sch = {}
    for n in ("gpu-catalog", "fleet", "model-card", "workload", "profile"):
        with open(os.path.join(SOURCE_DIR, "schemas", n + ".schema.json")) as f:
            sch[n] = json.load(f)
    reg = Registry().with_resources([(s["$id"], Resource.from_contents(s))
                                     for s in sch.values()])
    return {n: jsonschema.Draft202012Validator(sch[n], registry=reg) for n in names}


def plan(tmp, fleet, workload, profile=None, catalog=None):
    args = [MEDLEY, "plan"]
    for flag, doc in (("--fleet", fleet), ("--workload", workload), ("--profile", profile),
                      ("--catalog", catalog)):
        if doc is None:
            continue
        path = os.path.join(tmp, flag.strip("-") + ".json")
        with open(path, "w") as f:
            json.dump(doc, f)
        args += [flag, path]
    return subprocess.run(args, capture_output=True, text=True, timeout=120)


def objects(doc, path="$"):
    """(path, dict) of every object in doc, the ones under SKIP left out."""
    if isinstance(doc, dict):
        yield path, doc
        for k, v in doc.items():
            if k not in SKIP:
                yield from objects(v, path + "." + k)
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from objects(v, "%s[%d]" % (path, i))


def refused(p, what, needle):
    if p.returncode == 0:
        fail("%s: medley plan accepted it:\n%s" % (what, p.stdout[-600:]))
    if p.returncode != 1:
        fail("%s: exit %d (want 1, a clear error):\n%s" % (what, p.returncode, p.stderr[-600:]))
    if needle not in p.stderr:
        fail("%s: the error does not name %r:\n%s" % (what, needle, p.stderr[-600:]))


def main():
    tmp = tempfile.mkdtemp(prefix="medley-sched-")
    docs = {"fleet": load("fleet.mixed"), "workload": load("workload.mixed"),
            "profile": load("profile.measured")}
    schemas = schema_validators(["fleet", "workload", "profile"])
    p = plan(tmp, **docs)
    if p.returncode != 0:
        fail("the examples do not plan: %s" % p.stderr[-800:])
    rent = load("fleet.rent")
    if plan(tmp, rent, docs["workload"]).returncode != 0:
        fail("fleet.rent does not plan")

    # 1. an unknown key in every object
    n = 0
    for which, base in list(docs.items()) + [("fleet", rent)]:
        for path, _ in list(objects(base)):
            doc = copy.deepcopy(base)
            target = dict(objects(doc))[path]
            target["zz_unknown"] = 1
            if schemas[which].is_valid(doc):
                fail("%s %s: the schema accepts an unknown key; the test is wrong" % (which, path))
            args = dict(docs)
            args[which] = doc
            if which == "fleet" and base is rent:
                args.pop("profile")
            refused(plan(tmp, **args), "%s %s + zz_unknown" % (which, path), "zz_unknown")
            n += 1
    w = copy.deepcopy(docs["workload"])
    m = w["models"][0]
    m["deadline"] = m.pop("deadline_s", 3600)
    refused(plan(tmp, docs["fleet"], w, docs["profile"]), "deadline for deadline_s", "'deadline'")
    print("ok: %d objects given an unknown key, and deadline for deadline_s: refused" % n)

    # 2. figures out of any card's range
    cases = []
    f = copy.deepcopy(docs["fleet"])
    f.setdefault("prices", {})[f["pools"][0]["type"]] = 1e308
    cases.append(("fleet.prices 1e308", dict(docs, fleet=f), "fleet.prices"))
    f = copy.deepcopy(docs["fleet"])
    f["pools"][0]["usd_per_hour"] = 1e308
    cases.append(("pool usd_per_hour 1e308", dict(docs, fleet=f), "usd_per_hour"))
    f = copy.deepcopy(docs["fleet"])
    f["inter_host_gbps"] = 1e308
    cases.append(("inter_host_gbps 1e308", dict(docs, fleet=f), "inter_host_gbps"))
    cat = {"version": 1, "kind": "medley.gpu-catalog",
           "gpus": [{"name": "X1", "memory_gb": 80, "hbm_gbps": 2000, "bf16_tflops": 1e308,
                     "usd_per_hour": 1.0}]}
    f = {"version": 1, "kind": "medley.fleet", "pools": [{"type": "X1", "count": 2}]}
    cases.append(("catalog bf16_tflops 1e308", dict(docs, fleet=f, catalog=cat, profile=None),
                  "bf16_tflops"))
    cat2 = copy.deepcopy(cat)
    cat2["gpus"][0].update(bf16_tflops=300, memory_gb=1e308)
    cases.append(("catalog memory_gb 1e308", dict(docs, fleet=f, catalog=cat2, profile=None),
                  "memory_gb"))
    cat3 = copy.deepcopy(cat)
    cat3["gpus"][0].update(bf16_tflops=300, usd_per_hour=1e308)
    cases.append(("catalog usd_per_hour 1e308", dict(docs, fleet=f, catalog=cat3, profile=None),
                  "usd_per_hour"))
    for rps in (1e308, 1e100):
        pr = copy.deepcopy(docs["profile"])
        for b in pr.get("buckets", []):
            b.pop("max_output_tokens_per_s", None)
            b["max_requests_per_s"] = rps
        cases.append(("profile %g req/s" % rps, dict(docs, profile=pr), "requests/s"))
    for what, args, needle in cases:
        refused(plan(tmp, **args), what, needle)
    print("ok: %d out-of-range figures refused with exit 1 (no GLPK abort)" % len(cases))
    minor(tmp, docs)


def minor(tmp, docs):
    """Issue 39 item 13: each was accepted (or misquoted) before."""
    cases = []
    w = copy.deepcopy(docs["workload"])
    w["models"][0].setdefault("classes", [{"name": "c", "input_mean": 100, "output_mean": 50}])
    w["models"][0]["classes"][0]["max_tokens"] = 3000000000  # was quoted as -1294967296
    cases.append(("max_tokens 3e9", dict(docs, workload=w), "max_tokens must be in [1, 100000000]"))
    w = copy.deepcopy(docs["workload"])
    w["models"][0]["deadline_s"] = 0  # silently meant "no deadline"
    cases.append(("deadline_s 0", dict(docs, workload=w), "deadline_s must be a positive"))
    w = copy.deepcopy(docs["workload"])
    w["horizon_s"] = 1e-300  # printed a 300-digit number
    cases.append(("horizon_s 1e-300", dict(docs, workload=w), "horizon_s must be in [1, 1e8]"))
    pr = copy.deepcopy(docs["profile"])
    pr.pop("batches", None)
    pr.update(model=docs["workload"]["models"][0]["model"], device_type="A10G")
    pr["buckets"] = [{"input_lo": 0, "input_hi": 100000, "output_lo": 0, "output_hi": 100000,
                      "max_requests_per_s": 1e6}]  # accepted with only a note (x409,437)
    cases.append(("profile 1e6 req/s", dict(docs, profile=pr), "max_requests_per_s"))
    for bad, needle in (("rack/7", "'/' at character 5"), ("a\nb", "control character 0x0a")):
        f = copy.deepcopy(docs["fleet"])
        f["pools"][0]["name"] = bad
        cases.append(("pool name %r" % bad, dict(docs, fleet=f), needle))
    for what, args, needle in cases:
        refused(plan(tmp, **args), what, needle)
    # a key given twice: the last one silently won
    path = os.path.join(tmp, "dup-workload.json")
    with open(path, "w") as f:
        f.write(json.dumps(docs["workload"])[:-1] + ', "horizon_s": 60, "horizon_s": 7200}')
    args = [MEDLEY, "plan"]
    for flag in ("fleet", "profile"):
        p2 = os.path.join(tmp, flag + ".json")
        with open(p2, "w") as f:
            json.dump(docs[flag], f)
        args += ["--" + flag, p2]
    p = subprocess.run(args + ["--workload", path], capture_output=True, text=True, timeout=120)
    refused(p, "duplicate key", "duplicate object key")
    print("ok: %d item-13 inputs refused naming the field" % (len(cases) + 1))
    # near-miss device names were mapped to another type without a word
    for dev, word, closest in (("H100 NVL", "NVL", "H100-SXM"), ("A100 80GB PCIe", "PCIE", "A100-80GB-SXM"),
                               ("RTX 3090 Ti", "TI", "RTX-3090")):
        pr = copy.deepcopy(docs["profile"])
        pr["device_type"] = dev
        p = plan(tmp, docs["fleet"], docs["workload"], pr)
        if p.returncode != 0:
            fail("profile on %r: exit %d: %s" % (dev, p.returncode, p.stderr[-400:]))
        note = [l for l in (p.stdout + p.stderr).splitlines() if "closest catalog type" in l]
        if not note or word not in note[0] or closest not in note[0]:
            fail("profile on %r: no note naming %s as the closest type and %r as the word it "
                 "does not account for:\n%s" % (dev, closest, word, p.stdout[-600:]))
    # an exact driver name gives no such note
    pr = copy.deepcopy(docs["profile"])
    pr["device_type"] = "NVIDIA H100 80GB HBM3"
    p = plan(tmp, docs["fleet"], docs["workload"], pr)
    if p.returncode != 0 or "closest catalog type" in p.stdout + p.stderr:
        fail("profile on the H100's driver name: exit %d or a near-miss note:\n%s"
             % (p.returncode, p.stdout[-600:]))
    print("ok: near-miss device names noted with the closest catalog type")


if __name__ == "__main__":
    main()

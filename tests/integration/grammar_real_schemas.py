#!/usr/bin/env python3
"""grammar_real_schemas.py — real and extraction-style schemas through medley's compiler.

1. The vendored schemas of the `check-jsonschema` wheel on PyPI (CI configs, compose,
   renovate, ...; downloaded at test time): each must compile, or be refused with a message
   naming the keyword and its JSON pointer ("'kw' at /ptr: ..."), in strict and relaxed
   mode; compile times reported.
2. 240 extraction-style schemas made here from a fixed seed (flat records, nested arrays of
   objects, enums, type unions with null, anyOf of objects, $defs recursion, bounds,
   formats, patterns), each with an instance made alongside it that follows the schema and
   the serialization policy: every schema must compile under strict, and its instance be
   accepted; the instance with one required property dropped must be refused.

usage: grammar_real_schemas.py path/to/gr_check      (exit 77 when PyPI is unreachable:
the extraction part still runs first and must pass)
"""
import glob
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import zipfile

KEYWORD = re.compile(r"^'([^']+)' at (/\S*)")


def run(gr_check, reqs):
    p = subprocess.run([gr_check], input="\n".join(json.dumps(r) for r in reqs) + "\n",
                       capture_output=True, text=True, timeout=1800)
    if p.returncode:
        sys.exit("gr_check failed: " + p.stderr)
    return [json.loads(l) for l in p.stdout.splitlines()]


def dumps(v):
    return json.dumps(v, separators=(",", ":"), ensure_ascii=False)


# ---- extraction-style schemas with an instance each -----------------------------------

WORDS = ["name", "title", "city", "email", "total", "items", "price", "date", "status",
         "notes", "vendor", "qty", "sku", "tags", "address", "phone", "country", "score",
         "author", "year", "id", "kind", "amount", "currency", "lines", "summary"]


def leaf(r):
    """A (schema, value) pair for a scalar field."""
    k = r.randrange(11)
    if k == 0:
        return {"type": "string"}, r.choice(["Acme Corp", "caf\u00e9 \"du\" coin", "line\nbreak", ""])
    if k == 1:
        lo = r.randrange(-50, 50)
        return {"type": "integer", "minimum": lo, "maximum": lo + r.randrange(1, 500)}, lo + 1
    if k == 2:
        return {"type": "number"}, r.choice([3.25, -0.5, 12, 1e-05, 6.02e+23])
    if k == 3:
        vals = r.sample(["red", "green", "blue", "open", "closed", "n/a", "\u00e9t\u00e9"], 3)
        return {"enum": vals}, vals[1]
    if k == 4:
        return {"type": ["string", "null"]}, r.choice([None, "maybe"])
    if k == 5:
        return {"type": "string", "format": "date"}, "2024-02-29"
    if k == 6:
        return {"type": "string", "format": "email"}, "ana.lopez@example.com"
    if k == 7:
        return {"type": "boolean"}, r.choice([True, False])
    if k == 8:
        return {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"}, "ABC-0042"
    if k == 9:
        return {"type": "string", "maxLength": 12, "minLength": 1}, "short text"
    return {"type": "number", "minimum": 0, "exclusiveMaximum": 100}, 99.5


def record(r, depth):
    props, inst, req = {}, {}, []
    for w in r.sample(WORDS, r.randrange(1, 7)):
        k = r.randrange(10) if depth < 2 else 0
        if k == 8:
            s, v = record(r, depth + 1)
        elif k == 9:
            s0, v0 = record(r, depth + 1)
            s, v = {"type": "array", "items": s0, "minItems": 1}, [v0, v0]
        elif k == 7:
            s0, v0 = leaf(r)
            s, v = {"type": "array", "items": s0, "maxItems": 4}, [v0]
        else:
            s, v = leaf(r)
        props[w] = s
        if r.random() < 0.7:
            req.append(w)
            inst[w] = v
        elif r.random() < 0.5:
            inst[w] = v
    schema = {"type": "object", "properties": props, "required": req,
              "additionalProperties": False}
    # the instance in schema order
    return schema, {k: inst[k] for k in props if k in inst}


def extraction_cases(n, seed=36):
    r = random.Random(seed)
    cases = []
    for i in range(n):
        kind = i % 4
        s, v = record(r, 0)
        if kind == 1:  # anyOf of two records
            s2, v2 = record(r, 1)
            s = {"anyOf": [s, s2]}
        elif kind == 2:  # recursion through $defs
            s = {"$defs": {"node": {"type": "object", "properties": {
                "label": {"type": "string"}, "kids": {"type": "array",
                                                      "items": {"$ref": "#/$defs/node"}}},
                "required": ["label", "kids"], "additionalProperties": False}},
                "type": "object", "properties": {"root": {"$ref": "#/$defs/node"}, "meta": s},
                "required": ["root", "meta"], "additionalProperties": False}
            v = {"root": {"label": "a", "kids": [{"label": "b", "kids": []}]}, "meta": v}
        elif kind == 3:  # a list of records
            s = {"type": "object", "properties": {"records": {"type": "array", "items": s}},
                 "required": ["records"], "additionalProperties": False}
            v = {"records": [v, v]}
        cases.append((s, v))
    return cases


def drop_required(s, v):
    """v without one required top-level property, when s names one; else None."""
    if "anyOf" in s or not isinstance(v, dict):
        return None
    for k in s.get("required", []):
        if k in v:
            return {x: y for x, y in v.items() if x != k}
    return None


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    gr_check = sys.argv[1]
    cases = extraction_cases(240)
    reqs = []
    for s, v in cases:
        inst = [dumps(v)]
        bad = drop_required(s, v)
        if bad is not None:
            inst.append(dumps(bad))
        reqs.append({"schema": json.dumps(s), "strict": True, "instances": inst})
    fails = 0
    times = []
    for (s, v), a in zip(cases, run(gr_check, reqs)):
        if not a["ok"]:
            print("REFUSED extraction schema:", a["error"], json.dumps(s)[:300])
            fails += 1
            continue
        times.append(a["compile_ms"])
        if not a["accept"][0]:
            print("INSTANCE REFUSED:", dumps(v)[:300], "schema", json.dumps(s)[:300])
            fails += 1
        if len(a["accept"]) > 1 and a["accept"][1]:
            print("MISSING REQUIRED ACCEPTED:", json.dumps(s)[:300])
            fails += 1
    times.sort()
    print(f"extraction-style schemas: {len(cases)}, compiled {len(times)}, failures {fails}; "
          f"compile p50 {times[len(times) // 2]:.3f} ms, max {times[-1]:.3f} ms")
    if fails:
        return 1

    tmp = tempfile.mkdtemp(prefix="medley-cjs-")
    try:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary",
                        ":all:", "check-jsonschema", "-d", tmp], check=True, timeout=300,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except Exception as e:
        print(f"SKIP (vendored schemas): cannot download check-jsonschema from PyPI ({e})")
        return 77
    whl = glob.glob(os.path.join(tmp, "check_jsonschema-*.whl"))
    names, texts = [], []
    with zipfile.ZipFile(whl[0]) as z:
        for n in sorted(z.namelist()):
            if "/builtin_schemas/vendor/" in n and n.endswith(".json"):
                names.append(os.path.basename(n)[:-5])
                texts.append(z.read(n).decode("utf-8"))
    print(f"{os.path.basename(whl[0])}: {len(names)} vendored schemas")
    bad = 0
    for strict in (True, False):
        answers = run(gr_check, [{"schema": t, "strict": strict, "instances": []} for t in texts])
        ok, refused, by_kw = 0, 0, {}
        for name, a in zip(names, answers):
            if a["ok"]:
                ok += 1
                rel = f" relaxed: {a['relaxed'][:100]}" if a["relaxed"] else ""
                print(f"  {'strict' if strict else 'relaxed'} {name}: compiled in "
                      f"{a['compile_ms']:.1f} ms{rel}")
                continue
            refused += 1
            m = KEYWORD.match(a["error"])
            if not m and not a["error"].startswith(("the grammar generates no string",
                                                    "grammar too large", "schema is ")):
                print(f"  REFUSAL WITHOUT A KEYWORD ({name}): {a['error']}")
                bad += 1
            key = m.group(1) if m else a["error"][:40]
            by_kw[key] = by_kw.get(key, 0) + 1
            print(f"  {'strict' if strict else 'relaxed'} {name}: refused: {a['error'][:140]}")
        print(f"{'strict' if strict else 'relaxed'}: compiled {ok}, refused {refused} "
              f"(by keyword: {', '.join(f'{k} {v}' for k, v in sorted(by_kw.items(), key=lambda x: -x[1]))})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""grammar_conformance.py — the JSON-Schema-Test-Suite (draft2020-12 files shipped in the
`jsonschema` sdist on PyPI, fetched at test time) against medley's JSON Schema grammars.

For every schema the compiler accepts (strict mode), the grammar must accept every valid
instance and refuse every invalid one. Instances are written in the grammar's serialization
policy (docs/structured.md): compact, UTF-8, integral numbers as integers. Property order
follows the schema in the grammar, and JSON Schema validity never depends on key order, so
each instance is tried in its key orders (every permutation of every object's keys, up to
MAX_ORDERS combinations): a valid instance passes when the grammar accepts at least one of
them, an invalid one when the grammar refuses all of them. Schemas the compiler refuses are
counted per keyword named in the refusal. Mismatches must be 0.

usage: grammar_conformance.py path/to/gr_check [--suite DIR] [--verbose]
Exit 77 (ctest skip) when the sdist cannot be downloaded.
"""
import glob
import itertools
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile

MAX_ORDERS = 120


def canon(v):
    if isinstance(v, bool) or v is None:
        return v
    if isinstance(v, float) and v.is_integer() and abs(v) < 2**63:
        return int(v)
    if isinstance(v, list):
        return [canon(x) for x in v]
    if isinstance(v, dict):
        return {k: canon(x) for k, x in v.items()}
    return v


def orders(v):
    """Yield v with its objects' keys in different orders (lazily, product of permutations)."""
    if isinstance(v, dict):
        keys = list(v.keys())
        perms = itertools.permutations(keys) if len(keys) <= 6 else iter([tuple(keys)])
        subs = {k: list(itertools.islice(orders(v[k]), 8)) for k in keys}
        for p in perms:
            for combo in itertools.product(*[subs[k] for k in p]):
                yield dict(zip(p, combo))
    elif isinstance(v, list):
        subs = [list(itertools.islice(orders(x), 4)) for x in v]
        for combo in itertools.product(*subs):
            yield list(combo)
    else:
        yield v


def dumps(v):
    s = json.dumps(v, separators=(",", ":"), ensure_ascii=False)
    try:
        s.encode("utf-8")
        return s
    except UnicodeEncodeError:  # lone surrogates: only escaped form is valid JSON text
        return json.dumps(v, separators=(",", ":"))


def fetch_suite():
    tmp = tempfile.mkdtemp(prefix="medley-jsonschema-")
    try:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-binary", ":all:",
                        "--no-deps", "jsonschema", "-d", tmp], check=True, timeout=300,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except Exception as e:  # offline, no pip
        print(f"SKIP: cannot download the jsonschema sdist from PyPI ({e})")
        sys.exit(77)
    sd = glob.glob(os.path.join(tmp, "jsonschema-*.tar.gz"))
    if not sd:
        print("SKIP: pip download gave no jsonschema sdist")
        sys.exit(77)
    with tarfile.open(sd[0]) as t:
        members = [m for m in t.getmembers() if "/json/tests/draft2020-12/" in m.name]
        t.extractall(tmp, members=members)
    d = glob.glob(os.path.join(tmp, "jsonschema-*", "json", "tests", "draft2020-12"))
    return d[0], os.path.basename(sd[0])


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    gr_check = sys.argv[1]
    verbose = "--verbose" in sys.argv
    if "--suite" in sys.argv:
        suite, origin = sys.argv[sys.argv.index("--suite") + 1], "local"
    else:
        suite, origin = fetch_suite()
    files = sorted(glob.glob(os.path.join(suite, "*.json")))
    reqs, meta = [], []
    flipped = [0]
    for f in files:
        kw = os.path.basename(f)[:-5]
        for group in json.load(open(f, encoding="utf-8")):
            insts, spans = [], []
            for t in group["tests"]:
                valid = t["valid"]
                if kw == "format" and "only an annotation by default" in t["description"]:
                    valid = False  # medley asserts formats (docs/structured.md)
                    flipped[0] += 1
                cands = [dumps(x) for x in itertools.islice(orders(canon(t["data"])), MAX_ORDERS)]
                spans.append((len(insts), len(cands), valid, t["description"]))
                insts.extend(cands)
            reqs.append(json.dumps({"schema": json.dumps(group["schema"]), "strict": True,
                                    "instances": insts}))
            meta.append((kw, group["description"], spans, group["schema"]))
    p = subprocess.run([gr_check], input="\n".join(reqs) + "\n", capture_output=True,
                       text=True, timeout=1200)
    if p.returncode != 0:
        print(p.stderr)
        return 1
    answers = [json.loads(l) for l in p.stdout.splitlines()]
    assert len(answers) == len(reqs), (len(answers), len(reqs))
    per_kw = {}
    refused_by = {}
    mismatches = []
    n_inst = 0
    compile_ms = []
    for (kw, desc, spans, schema), a in zip(meta, answers):
        st = per_kw.setdefault(kw, {"accepted": 0, "refused": 0})
        if not a["ok"]:
            st["refused"] += 1
            m = re.match(r"'([^']+)' at", a.get("error", ""))
            key = m.group(1) if m else a.get("error", "")[:50]
            refused_by[key] = refused_by.get(key, 0) + 1
            if verbose:
                print(f"refused {kw}: {desc}: {a.get('error')}")
            continue
        st["accepted"] += 1
        compile_ms.append(a["compile_ms"])
        acc = a["accept"]
        for off, n, valid, tdesc in spans:
            n_inst += 1
            got = acc[off:off + n]
            ok = any(got) if valid else not any(got)
            if not ok:
                mismatches.append(f"{kw}: {desc}: {tdesc}: valid={valid} "
                                  f"schema={json.dumps(schema)[:200]}")
    print(f"JSON-Schema-Test-Suite draft2020-12 from {origin}")
    print(f"{'file':28s} {'accepted':>8s} {'refused':>8s}")
    for kw in sorted(per_kw):
        print(f"{kw:28s} {per_kw[kw]['accepted']:8d} {per_kw[kw]['refused']:8d}")
    tot_a = sum(v["accepted"] for v in per_kw.values())
    tot_r = sum(v["refused"] for v in per_kw.values())
    print(f"{'total':28s} {tot_a:8d} {tot_r:8d}")
    print("refusals by keyword: " +
          ", ".join(f"{k} {v}" for k, v in sorted(refused_by.items(), key=lambda x: -x[1])))
    compile_ms.sort()
    if compile_ms:
        print(f"compile time over accepted schemas: p50 {compile_ms[len(compile_ms) // 2]:.3f} ms, "
              f"max {compile_ms[-1]:.3f} ms")
    print(f"instances checked: {n_inst} ({flipped[0]} format.json strings the suite treats "
          f"as annotation-only are expected refused: medley asserts formats), "
          f"mismatches: {len(mismatches)}")
    for m in mismatches:
        print("MISMATCH " + m)
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())

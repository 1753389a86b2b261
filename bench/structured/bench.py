#!/usr/bin/env python3
"""bench/structured — medley's grammar engine against xgrammar and llguidance, same run,
same vocabulary (the model's token bytes as medley's tokenizer gives them), same schemas
(schemas.json), same token sequences (each schema's instance tokenized by medley).

Measured, per schema and model:
  compile  medley: gr_from_json_schema + gr_prepare (every mask-cache entry computed);
           xgrammar: GrammarCompiler.compile_json_schema (its adaptive mask cache included;
           compiler cache disabled; strict_mode=False, i.e. JSON Schema's own defaults); llguidance: LLMatcher construction from the schema
           (its lexer and slices; llguidance computes masks lazily by design).
  mask     per-token time to fill the next-token bitmask, p50 and p99 over the instance's
           tokens plus the final end token; medley's warm pass (after gr_prepare) and cold
           pass (entries computed on first use) are both reported.
Compile times are CPU time of the process (best of 3); each mask time is the fastest of 3
passes at that position (a shared machine's preemptions would otherwise be the p99).
Peers run through their Python APIs (one call per mask; xgrammar fills a torch int32
bitmask, llguidance a numpy one), so their figures include a Python call (~0.1-0.3 us).

usage:
  python3 -m venv /tmp/grvenv && /tmp/grvenv/bin/pip install xgrammar==0.2.8 llguidance==1.9.1
  /tmp/grvenv/bin/python bench/structured/bench.py --build build [--models smollm2,gemma3]
"""
import argparse
import json
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
MODELS = {"smollm2": "SmolLM2-135M-Instruct.Q4_1.gguf", "gemma3": "gemma-3-270m-q4_k_m.gguf"}


def models_dir():
    return os.environ.get("MEDLEY_MODELS") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "medley", "models")


def build_bench(build, out):
    libs = [os.path.join(build, p) for p in (
        "engine/libmedley_engine.a", "engine/grammar/libmedley_grammar.a",
        "engine/tokenizer/libmedley_tokenizer.a", "engine/weights/libmedley_weights.a",
        "common/libmedley_common.a")]
    for l in libs:
        if not os.path.exists(l):
            sys.exit("missing %s: build medley first (cmake --build %s)" % (l, build))
    subprocess.run(["cc", "-O2", "-std=gnu11", "-I", ROOT, os.path.join(HERE, "bench_structured.c"),
                    "-o", out, *libs, "-lpcre2-8", "-lutf8proc", "-ljansson", "-lhiredis",
                    "-lpthread", "-lm"], check=True)


def read_vocab(path):
    toks, special = [], []
    with open(path, "rb") as f:
        n = struct.unpack("<i", f.read(4))[0]
        for i in range(n):
            l = struct.unpack("<I", f.read(4))[0]
            sp = f.read(1)[0]
            toks.append(f.read(l))
            special.append(sp)
    return toks, special


def pct(v, p):
    v = sorted(x for x in v if x < 1e17)  # positions reached (all, unless a token was refused)
    return v[int(p * (len(v) - 1) + 0.5)]


def bench_xgrammar(toks, special, eos_all, schemas, seqs):
    import torch
    import xgrammar as xgr
    enc = [t if not s else b"" for t, s in zip(toks, special)]
    info = xgr.TokenizerInfo(enc, xgr.VocabType.RAW, vocab_size=len(enc), stop_token_ids=eos_all)
    out = {}
    for sc in schemas:
        name = sc["name"]
        comp = []
        for _ in range(3):
            compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
            t0 = time.process_time()
            if sc["schema"] == {"type": "object"}:
                # xgrammar 0.2.8 reads {"type": "object"} as {} only: its json_object is
                # the builtin JSON grammar (what vLLM uses for response_format json_object)
                cg = compiler.compile_builtin_json_grammar()
            else:
                cg = compiler.compile_json_schema(json.dumps(sc["schema"]), any_whitespace=False,
                                                  separators=(",", ":"), strict_mode=False)
            comp.append((time.process_time() - t0) * 1e3)
        bm = xgr.allocate_token_bitmask(1, info.vocab_size)
        seq = seqs[name] + [eos_all[0]]
        times = [1e18] * len(seq)
        ok = True
        for _ in range(3):
            m = xgr.GrammarMatcher(cg)
            for i, t in enumerate(seq):
                t0 = time.perf_counter()
                m.fill_next_token_bitmask(bm)
                times[i] = min(times[i], (time.perf_counter() - t0) * 1e6)
                if not m.accept_token(t):
                    ok = False
                    break
        out[name] = {"compile_ms": min(comp), "p50_us": pct(times, 0.5),
                     "p99_us": pct(times, 0.99), "ok": ok}
    return out


def bench_llguidance(toks, special, eos_all, schemas, seqs):
    import numpy as np
    import llguidance as llg
    import llguidance.numpy as lnp

    class Tok:
        def __init__(self):
            self.eos_token_id = eos_all[0]
            self.bos_token_id = None
            self.tokens = [t if not s else b"\xff[special_%d]" % i
                           for i, (t, s) in enumerate(zip(toks, special))]
            self.special_token_ids = [i for i, s in enumerate(special) if s]
            self.lookup = {}
            for i, t in enumerate(self.tokens):
                if not special[i] and t not in self.lookup:
                    self.lookup[t] = i

        def __call__(self, s):  # greedy longest match (only used for forced tokens)
            if isinstance(s, str):
                s = s.encode()
            out, i = [], 0
            while i < len(s):
                for j in range(min(len(s), i + 64), i, -1):
                    if s[i:j] in self.lookup:
                        out.append(self.lookup[s[i:j]])
                        i = j
                        break
                else:
                    i += 1
            return out

    tk = llg.LLTokenizer(llg.TokenizerWrapper(Tok()), eos_token=eos_all)
    out = {}
    for sc in schemas:
        name = sc["name"]
        g = llg.LLMatcher.grammar_from_json_schema(
            json.dumps(sc["schema"]), defaults={"whitespace_flexible": False})
        comp = []
        for _ in range(3):
            t0 = time.process_time()
            m = llg.LLMatcher(tk, g, log_level=0)
            comp.append((time.process_time() - t0) * 1e3)
        if m.is_error():
            out[name] = {"error": m.get_error()}
            continue
        bm = lnp.allocate_token_bitmask(1, tk.vocab_size)
        seq = seqs[name] + [eos_all[0]]
        times = [1e18] * len(seq)
        ok = True
        for _ in range(3):
            m = llg.LLMatcher(tk, g, log_level=0)
            for i, t in enumerate(seq):
                t0 = time.perf_counter()
                lnp.fill_next_token_bitmask(m, bm, 0)
                times[i] = min(times[i], (time.perf_counter() - t0) * 1e6)
                if not m.consume_token(t):
                    ok = False
                    break
        out[name] = {"compile_ms": min(comp), "p50_us": pct(times, 0.5),
                     "p99_us": pct(times, 0.99), "ok": ok}
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--models", default="smollm2,gemma3")
    ap.add_argument("--schemas", default=os.path.join(HERE, "schemas.json"))
    ap.add_argument("--json", help="write all figures here")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="medley-bench-structured-")
    exe = os.path.join(tmp, "bench_structured")
    build_bench(a.build, exe)
    schemas = json.load(open(a.schemas, encoding="utf-8"))
    report = {}
    for key in a.models.split(","):
        model = os.path.join(models_dir(), MODELS[key])
        if not os.path.exists(model):
            print(f"{key}: {model} missing, skipped")
            continue
        d = os.path.join(tmp, key)
        os.makedirs(d, exist_ok=True)
        p = subprocess.run([exe, model, a.schemas, d], capture_output=True, text=True)
        if p.returncode:
            print(p.stderr)
            sys.exit(f"bench_structured failed on {key}")
        med = {j["name"]: j for j in map(json.loads, p.stdout.splitlines())}
        toks, special = read_vocab(os.path.join(d, "vocab.bin"))
        seqs = json.load(open(os.path.join(d, "tokens.json")))
        eos_all = seqs["eos_all"]
        xg = bench_xgrammar(toks, special, eos_all, schemas, seqs)
        ll = bench_llguidance(toks, special, eos_all, schemas, seqs)
        report[key] = {"medley": med, "xgrammar": xg, "llguidance": ll}
        print(f"\n{key}: {len(toks)} tokens ({p.stderr.strip().splitlines()[-1]})")
        print(f"{'schema':12s} {'toks':>5s} | {'compile ms: medley':>18s} {'xgr':>8s} {'llg':>8s} | "
              f"{'mask p50 us: medley':>19s} {'xgr':>6s} {'llg':>6s} | "
              f"{'p99 us: medley':>14s} {'xgr':>7s} {'llg':>7s} | {'cold p50/p99':>14s}")
        for sc in schemas:
            n = sc["name"]
            m, x, l = med[n], xg.get(n, {}), ll.get(n, {})
            print(f"{n:12s} {m['tokens']:5d} | {m['compile_prepare_ms']:18.2f} "
                  f"{x.get('compile_ms', float('nan')):8.2f} {l.get('compile_ms', float('nan')):8.2f} | "
                  f"{m['warm_p50_us']:19.2f} {x.get('p50_us', float('nan')):6.2f} "
                  f"{l.get('p50_us', float('nan')):6.2f} | {m['warm_p99_us']:14.2f} "
                  f"{x.get('p99_us', float('nan')):7.2f} {l.get('p99_us', float('nan')):7.2f} | "
                  f"{m['cold_p50_us']:6.1f}/{m['cold_p99_us']:7.1f}"
                  + ("" if x.get("ok", True) and l.get("ok", True) and m["ok"] else "  (a token refused!)"))

        def ratios(field_m, field_p, peer):
            r = [med[n][field_m] / peer[n][field_p] for n in med if n in peer and field_p in peer[n]]
            return statistics.geometric_mean(r) if r else float("nan")

        print(f"ratios medley/peer (geometric mean over schemas; < 1: medley faster): "
              f"compile x{ratios('compile_prepare_ms', 'compile_ms', xg):.2f} xgrammar, "
              f"x{ratios('compile_prepare_ms', 'compile_ms', ll):.2f} llguidance; "
              f"mask p50 x{ratios('warm_p50_us', 'p50_us', xg):.2f} / x{ratios('warm_p50_us', 'p50_us', ll):.2f}; "
              f"p99 x{ratios('warm_p99_us', 'p99_us', xg):.2f} / x{ratios('warm_p99_us', 'p99_us', ll):.2f}")
    if a.json:
        json.dump(report, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()

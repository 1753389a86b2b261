#!/usr/bin/env python3
"""BERT WordPiece: medley's tokenizer against Hugging Face's `tokenizers`, same run.

The texts are tok_wordpiece_match's 10,000 generated multilingual lines (fixed seed; about
1.1 M characters), tokenized with all-MiniLM-L6-v2's tokenizer.json ([CLS] ... [SEP] added).
medley: `medley tokenize --tokenizer FILE --ids --jsonl -`, the CPU seconds of its process
(loading the tokenizer and the JSON lines in and out included). tokenizers: `encode_batch`
on one thread (RAYON_NUM_THREADS=1, set here), CPU seconds of the call (loading excluded).
Best of --repeats; the ids must be identical (exit 1 otherwise).

    medley models fetch all-minilm-l6-v2
    python3 bench/tokenizer/bench_wordpiece.py --medley build/cli/medley --repeats 3
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import time

os.environ["RAYON_NUM_THREADS"] = "1"
from tokenizers import Tokenizer  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "integration"))
import tok_wordpiece_match as match  # noqa: E402


def child_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_medley(binary, tok, stdin):
    before = child_cpu()
    p = subprocess.run([binary, "tokenize", "--tokenizer", tok, "--ids", "--jsonl", "-"],
                       input=stdin, capture_output=True, check=True)
    ids = [[int(x) for x in line.split()] for line in p.stdout.decode().splitlines()]
    return child_cpu() - before, ids


def run_tokenizers(tok, texts):
    t = Tokenizer.from_file(tok)
    t.no_truncation()
    t.no_padding()
    c0 = time.process_time()
    enc = t.encode_batch(texts)
    return time.process_time() - c0, [e.ids for e in enc]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--medley", default="build/cli/medley")
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    tok = os.path.join(match.model_dir(), "tokenizer.json")
    if not os.path.exists(tok):
        sys.exit(f"{tok} not fetched: medley models fetch all-minilm-l6-v2")
    texts = match.generated(10000)
    stdin = "".join(json.dumps(t) + "\n" for t in texts).encode()
    best_m = best_t = float("inf")
    for _ in range(a.repeats):
        cm, got = run_medley(a.medley, tok, stdin)
        ct, want = run_tokenizers(tok, texts)
        best_m, best_t = min(best_m, cm), min(best_t, ct)
    same = got == want
    chars = sum(len(t) for t in texts)
    print(f"{len(texts)} texts, {chars} characters, {sum(map(len, want))} tokens")
    print(f"medley     {best_m:.3f} CPU s (process: load + JSON I/O included)")
    print(f"tokenizers {best_t:.3f} CPU s (encode_batch, 1 thread)")
    print(f"ratio {best_t / best_m:.2f}x; ids identical: {'yes' if same else 'NO'}")
    sys.exit(0 if same else 1)


if __name__ == "__main__":
    main()

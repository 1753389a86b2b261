#!/usr/bin/env python3
"""bench_embeddings.py — medley's embeddings against sentence-transformers on the same texts,
threads and machine, in one run (docs/embeddings.md, docs/benchmarks.md).

    python3 bench/embeddings/bench_embeddings.py --medley build/cli/medley \\
        --model DIR --n 10000 --threads 2 [--venv /opt/medley-st-venv] [--batch-sizes 16,32,64,128]

DIR is the sentence-transformers directory of all-MiniLM-L6-v2 (`medley models fetch
all-minilm-l6-v2`; `medley models path all-minilm-l6-v2` prints where it is). The
texts (make_texts.py: N texts of 8 to 256 tokens, words of the model's vocabulary, fixed
seed) are built at run time. The peer runs in its own venv (created on first use: torch and
sentence-transformers from PyPI) as `SentenceTransformer(DIR, device="cpu").encode(texts,
batch_size=B)` with torch.set_num_threads(THREADS), once per batch size, each in a fresh
process; its best batch size is the figure. medley runs `medley embed --jsonl --threads
THREADS`, before the peer and again after it (the faster run counts: the build box is shared).
Each side's texts/s counts tokenization and the forward passes (not model load), peak RSS is
the process's, CPU seconds are user + system (medley's for the whole process). Quality: the cosine of medley's
vector and the peer's on every text (F32 weights), with the minimum printed.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))

PEER = r"""
import json, resource, sys, time
import numpy as np, torch
from sentence_transformers import SentenceTransformer
model_dir, texts_path, threads, bs, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
torch.set_num_threads(threads)
texts = [json.loads(l) for l in open(texts_path)]
m = SentenceTransformer(model_dir, device="cpu")
m.encode(texts[:8], batch_size=bs)  # warm-up: first-call allocations, not the figure
r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
v = m.encode(texts, batch_size=bs, convert_to_numpy=True)
t1, r1 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
np.save(out, v.astype(np.float32))
print(json.dumps({"s": t1 - t0, "cpu": (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime),
                  "rss_mib": r1.ru_maxrss / 1024}))
"""


def ensure_venv(venv):
    py = os.path.join(venv, "bin", "python")
    ok = os.path.exists(py) and subprocess.run(
        [py, "-c", "import sentence_transformers, torch"], capture_output=True).returncode == 0
    if not ok:
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
        subprocess.run([py, "-m", "pip", "install", "-q", "torch", "sentence-transformers", "numpy"],
                       check=True)
    return py


def run_peer(py, model, texts, threads, bs, tmp):
    out = os.path.join(tmp, "peer-%d.npy" % bs)
    p = subprocess.run([py, "-c", PEER, model, texts, str(threads), str(bs), out],
                       capture_output=True, text=True)
    if p.returncode:
        sys.exit("peer failed (batch %d): %s" % (bs, p.stderr[-2000:]))
    r = json.loads(p.stdout.strip().splitlines()[-1])
    r["vectors"] = np.load(out)
    return r


def run_medley(medley, model, texts, threads, tmp):
    out, err_path = os.path.join(tmp, "medley.txt"), os.path.join(tmp, "medley.err")
    with open(texts) as fin, open(out, "w") as fout, open(err_path, "w") as ferr:
        p = subprocess.Popen([medley, "embed", "-m", model, "--jsonl", "--threads", str(threads),
                              "--stats"], stdin=fin, stdout=fout, stderr=ferr)
        _, status, ru = os.wait4(p.pid, 0)  # this child's own usage, not other children's
    err = open(err_path).read()
    if status:
        sys.exit("medley failed: " + err[-2000:])
    stats = [l for l in err.splitlines() if l.startswith("embed:")][-1]
    # "embed: N inputs, T tokens; tokenize A ms, forward B ms: ..."
    tok_ms = float(stats.split("tokenize ")[1].split(" ms")[0])
    fwd_ms = float(stats.split("forward ")[1].split(" ms")[0])
    vecs = np.array([json.loads(l) for l in open(out)], dtype=np.float32)
    return {"s": (tok_ms + fwd_ms) / 1000, "cpu_total": ru.ru_utime + ru.ru_stime,
            "rss_mib": ru.ru_maxrss / 1024, "vectors": vecs, "stats": stats}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--medley", default="build/cli/medley")
    ap.add_argument("--model", required=True)
    ap.add_argument("--n", type=int, default=10000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--venv", default="/opt/medley-st-venv")
    ap.add_argument("--batch-sizes", default="16,32,64,128")
    a = ap.parse_args()
    py = ensure_venv(a.venv)
    with tempfile.TemporaryDirectory() as tmp:
        texts = os.path.join(tmp, "texts.jsonl")
        subprocess.run([sys.executable, os.path.join(HERE, "make_texts.py"), a.model, str(a.n), texts],
                       check=True)
        m = run_medley(a.medley, a.model, texts, a.threads, tmp)
        print("medley: %.1f texts/s (%.2f s), peak RSS %.0f MiB, process CPU %.1f s; %s" % (
            a.n / m["s"], m["s"], m["rss_mib"], m["cpu_total"], m["stats"]))
        best = None
        for bs in map(int, a.batch_sizes.split(",")):
            r = run_peer(py, a.model, texts, a.threads, bs, tmp)
            print("sentence-transformers batch %d: %.1f texts/s (%.2f s), peak RSS %.0f MiB, CPU %.1f s"
                  % (bs, a.n / r["s"], r["s"], r["rss_mib"], r["cpu"]))
            if best is None or r["s"] < best["s"]:
                best, best["bs"] = r, bs
        m2 = run_medley(a.medley, a.model, texts, a.threads, tmp)  # again, after the peer
        print("medley again: %.1f texts/s (%.2f s), peak RSS %.0f MiB, process CPU %.1f s" % (
            a.n / m2["s"], m2["s"], m2["rss_mib"], m2["cpu_total"]))
        if m2["s"] < m["s"]:
            m = m2
        pv, mv = best["vectors"], m["vectors"]
        cos = (pv * mv).sum(1) / (np.linalg.norm(pv, axis=1) * np.linalg.norm(mv, axis=1))
        print("quality: cosine medley vs sentence-transformers over %d texts: min %.7f, mean %.7f"
              % (len(cos), cos.min(), cos.mean()))
        print("ratio: medley %.2fx sentence-transformers (batch %d) texts/s; peak RSS %.0f vs %.0f MiB"
              % (best["s"] / m["s"], best["bs"], m["rss_mib"], best["rss_mib"]))
        print("CPU seconds: medley %.1f (whole process, model load included) vs %.1f (encode only): "
              "%.2fx fewer" % (m["cpu_total"], best["cpu"], best["cpu"] / m["cpu_total"]))
        return 0 if cos.min() >= 0.9999 else 1


if __name__ == "__main__":
    sys.exit(main())

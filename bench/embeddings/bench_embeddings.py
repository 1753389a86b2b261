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


LLAMA = r"""
import json, resource, sys, time
import numpy as np
from llama_cpp import Llama
gguf, texts_path, threads, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
texts = [json.loads(l) for l in open(texts_path)]
m = Llama(model_path=gguf, embedding=True, n_threads=threads, n_threads_batch=threads,
          n_ctx=512, n_batch=512, n_ubatch=512, verbose=False)
m.create_embedding(texts[:8])  # warm-up
r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
d = m.create_embedding(texts)["data"]
t1, r1 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
v = np.array([x["embedding"] for x in sorted(d, key=lambda x: x["index"])], dtype=np.float32)
np.save(out, v)
print(json.dumps({"s": t1 - t0, "cpu": (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)}))
"""


def child(argv, stdin=None, stdout=None):
    """Run argv; (returncode, its own rusage, stderr text). Peak RSS is the child's alone."""
    with tempfile.TemporaryFile("w+") as ferr:
        p = subprocess.Popen(argv, stdin=stdin, stdout=stdout or subprocess.PIPE, stderr=ferr,
                             text=True)
        out = p.stdout.read() if stdout is None else ""
        _, status, ru = os.wait4(p.pid, 0)
        ferr.seek(0)
        return os.waitstatus_to_exitcode(status), ru, ferr.read(), out


def llama_gguf(model, tmp, py):
    """all-MiniLM-L6-v2 as GGUF F32 in tmp, converted by convert_hf_to_gguf.py with the gguf-py
    package of the llama-cpp-python 0.3.36 sdist (downloaded with pip, nothing installed); the
    converter runs in the peer venv (torch, safetensors)."""
    out = os.path.join(tmp, "all-minilm-l6-v2-f32.gguf")
    d = os.path.join(tmp, "sdist")
    subprocess.run([py, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                    "llama-cpp-python==0.3.36", "-d", d], check=True)
    subprocess.run(["tar", "xzf", os.path.join(d, "llama_cpp_python-0.3.36.tar.gz"), "-C", d,
                    "--wildcards", "*/vendor/llama.cpp/convert_hf_to_gguf.py",
                    "*/vendor/llama.cpp/gguf-py/*", "*/vendor/llama.cpp/conversion/*"], check=True)
    lc = os.path.join(d, "llama_cpp_python-0.3.36", "vendor", "llama.cpp")
    subprocess.run([py, "convert_hf_to_gguf.py", os.path.abspath(model), "--outtype", "f32",
                    "--outfile", out], cwd=lc, check=True, capture_output=True,
                   env=dict(os.environ, PYTHONPATH=os.path.join(lc, "gguf-py")))
    return out


def run_llama(lpy, gguf, texts, threads, tmp):
    out = os.path.join(tmp, "llama.npy")
    rc, ru, err, so = child([lpy, "-c", LLAMA, gguf, texts, str(threads), out])
    if rc:
        sys.exit("llama.cpp peer failed: " + err[-2000:])
    r = json.loads(so.strip().splitlines()[-1])
    r["rss_mib"] = ru.ru_maxrss / 1024
    r["vectors"] = np.load(out)
    return r


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
    rc, ru, err, so = child([py, "-c", PEER, model, texts, str(threads), str(bs), out])
    if rc:
        sys.exit("peer failed (batch %d): %s" % (bs, err[-2000:]))
    r = json.loads(so.strip().splitlines()[-1])
    r["rss_mib"] = ru.ru_maxrss / 1024  # the process's own peak, from the kernel
    r["vectors"] = np.load(out)
    return r


def run_medley(medley, model, texts, threads, tmp, bf16=False):
    out = os.path.join(tmp, "medley.txt")
    with open(texts) as fin, open(out, "w") as fout:
        rc, ru, err, _ = child([medley, "embed", "-m", model, "--jsonl", "--threads", str(threads),
                                "--stats"] + (["--bf16"] if bf16 else []), stdin=fin, stdout=fout)
    if rc and bf16:
        return None  # no AVX512-BF16 here: said by the caller
    if rc:
        sys.exit("medley failed: " + err[-2000:])
    stats = [l for l in err.splitlines() if l.startswith("embed:")][-1]
    # "embed: N inputs, T tokens; tokenize A ms, forward B ms: ..."
    tok_ms = float(stats.split("tokenize ")[1].split(" ms")[0])
    fwd_ms = float(stats.split("forward ")[1].split(" ms")[0])
    vecs = np.array([json.loads(l) for l in open(out)], dtype=np.float32)
    return {"s": (tok_ms + fwd_ms) / 1000, "cpu_total": ru.ru_utime + ru.ru_stime,
            "rss_mib": ru.ru_maxrss / 1024, "vectors": vecs, "stats": stats}


def cosines(a, b):
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def line(name, n, r, cpu_key="cpu"):
    print("%-34s %8.1f texts/s (%7.2f s), peak RSS %5.0f MiB, CPU %6.1f s" % (
        name, n / r["s"], r["s"], r["rss_mib"], r[cpu_key]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--medley", default="build/cli/medley")
    ap.add_argument("--model", required=True)
    ap.add_argument("--n", type=int, default=10000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--venv", default="/opt/medley-st-venv")
    ap.add_argument("--batch-sizes", default="16,32,64,128")
    ap.add_argument("--llama-python", default="/opt/medley-venv/bin/python",
                    help="a python that can import llama_cpp (the llama.cpp peer; skipped if not)")
    a = ap.parse_args()
    py = ensure_venv(a.venv)
    print("load average at start: %.2f %.2f %.2f (%d cores)" % (os.getloadavg() + (os.cpu_count(),)))
    with tempfile.TemporaryDirectory() as tmp:
        texts = os.path.join(tmp, "texts.jsonl")
        subprocess.run([sys.executable, os.path.join(HERE, "make_texts.py"), a.model, str(a.n), texts],
                       check=True)
        lpy = a.llama_python
        has_llama = os.path.exists(lpy) and subprocess.run(
            [lpy, "-c", "import llama_cpp"], capture_output=True).returncode == 0
        if not has_llama:
            print("llama.cpp peer skipped: %s cannot import llama_cpp (pip install "
                  "llama-cpp-python==0.3.36 in a venv and pass --llama-python)" % lpy)
        gguf = llama_gguf(a.model, tmp, py) if has_llama else None
        # Interleaved (medley, the peers, medley again): the build box is shared, so each
        # side's best of its runs counts and the load is printed.
        med = [run_medley(a.medley, a.model, texts, a.threads, tmp)]
        line("medley F32", a.n, med[0], "cpu_total")
        b16 = [run_medley(a.medley, a.model, texts, a.threads, tmp, bf16=True)]
        if b16[0]:
            line("medley BF16 (--bf16)", a.n, b16[0], "cpu_total")
        else:
            print("medley BF16 skipped: this CPU has no AVX512-BF16")
        best = None
        for bs in map(int, a.batch_sizes.split(",")):
            r = run_peer(py, a.model, texts, a.threads, bs, tmp)
            line("sentence-transformers batch %d" % bs, a.n, r)
            if best is None or r["s"] < best["s"]:
                best, best["bs"] = r, bs
        lr = run_llama(lpy, gguf, texts, a.threads, tmp) if has_llama else None
        if lr:
            line("llama.cpp (llama-cpp-python)", a.n, lr)
        med.append(run_medley(a.medley, a.model, texts, a.threads, tmp))
        line("medley F32 again", a.n, med[1], "cpu_total")
        if b16[0]:
            b16.append(run_medley(a.medley, a.model, texts, a.threads, tmp, bf16=True))
            line("medley BF16 again", a.n, b16[1], "cpu_total")
        m = min(med, key=lambda r: r["s"])
        mb = min(b16, key=lambda r: r["s"]) if b16[0] else None
        pv = best["vectors"]
        cos = cosines(pv, m["vectors"])
        print("quality: cosine medley F32 vs sentence-transformers over %d texts: min %.7f, mean %.7f"
              % (len(cos), cos.min(), cos.mean()))
        if mb:
            c = cosines(pv, mb["vectors"])
            print("quality: cosine medley BF16 vs sentence-transformers: min %.7f, mean %.7f"
                  % (c.min(), c.mean()))
        if lr:
            c = cosines(pv, lr["vectors"])
            print("quality: cosine llama.cpp vs sentence-transformers: min %.7f, mean %.7f"
                  % (c.min(), c.mean()))
        for name, r in [("medley F32", m)] + ([("medley BF16", mb)] if mb else []):
            print("ratio: %s %.2fx sentence-transformers (batch %d) texts/s, %.2fx its CPU "
                  "seconds; peak RSS %.0f vs %.0f MiB" % (
                      name, best["s"] / r["s"], best["bs"], best["cpu"] / r["cpu_total"],
                      r["rss_mib"], best["rss_mib"]))
            if lr:
                print("ratio: %s %.2fx llama.cpp texts/s, %.2fx its CPU seconds; peak RSS %.0f "
                      "vs %.0f MiB" % (name, lr["s"] / r["s"], lr["cpu"] / r["cpu_total"],
                                       r["rss_mib"], lr["rss_mib"]))
        print("load average at end: %.2f %.2f %.2f" % os.getloadavg())
        return 0 if cos.min() >= 0.9999 else 1


if __name__ == "__main__":
    sys.exit(main())

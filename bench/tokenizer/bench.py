#!/usr/bin/env python3
"""Tokenizer throughput: medley vs llama.cpp (llama-cpp-python), same machine, same run.

Setup (once): a medley build in BUILD (default build/) and llama-cpp-python:
    python3 -m venv /opt/medley-venv && /opt/medley-venv/bin/pip install llama-cpp-python==0.3.36
Run:
    /opt/medley-venv/bin/python bench/tokenizer/bench.py [--build build] [--model PATH] \
        [--corpus /tmp/medley-tok-corpus.txt] [--mb 12] [--repeats 3]

What it does: writes the deterministic corpus (make_corpus.py, >= 10 MB mixed text) if it is
missing, compiles bench_tok.c against BUILD's static libraries, then for each mode
  whole  the file as one text (one tokenize call)
  lines  each line as its own text (a batch of ~100k small prompts)
measures the best of --repeats runs of both tokenizers in CPU seconds of their own process
(so other jobs on a shared machine do not skew the ratio; both are single-threaded), plain
text: no BOS, no special-token parsing. llama.cpp is called through llama_tokenize() with a
buffer large enough for one pass (Llama.tokenize() would tokenize long texts twice). Finally
it checks that medley and llama.cpp give the same ids on the whole text and the same piece
for every token (decoding), and prints MB/s (10^6 bytes per CPU second) and the ratio.
"""
import argparse
import ctypes
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))


def default_model():
    d = os.environ.get("MEDLEY_MODELS") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "medley", "models")
    return os.path.join(d, "SmolLM2-135M-Instruct.Q4_1.gguf")


def build_bench(build, out):
    libs = [os.path.join(build, p) for p in (
        "engine/tokenizer/libmedley_tokenizer.a", "engine/weights/libmedley_weights.a",
        "common/libmedley_common.a")]
    for l in libs:
        if not os.path.exists(l):
            sys.exit("missing %s: build medley first (cmake --build %s)" % (l, build))
    cmd = ["cc", "-O2", "-std=gnu11", "-I", ROOT, os.path.join(HERE, "bench_tok.c"), "-o", out,
           *libs, "-lpcre2-8", "-lutf8proc", "-ljansson", "-lhiredis", "-lpthread", "-lm"]
    subprocess.run(cmd, check=True)


def llama_tokenize_timer(model):
    import llama_cpp
    from llama_cpp import Llama
    llm = Llama(model_path=model, vocab_only=True, verbose=False)
    vocab = llm._model.vocab  # the llama_vocab * that Llama.tokenize uses

    def tok(b, _keep=llm):  # _keep: the vocab dies with the Llama object
        cap = len(b) + 16
        buf = (llama_cpp.llama_token * cap)()
        n = llama_cpp.llama_tokenize(vocab, b, len(b), buf, cap, False, False)
        if n < 0:
            raise RuntimeError("llama_tokenize: buffer too small")
        return buf, n
    return tok, llama_cpp.__version__


def time_llama(tok, data, mode, repeats):
    units = [data] if mode == "whole" else data.splitlines(keepends=True)
    best, ntok, ids = 1e30, 0, None
    for _ in range(repeats):
        t0 = time.process_time()
        ntok = 0
        for u in units:
            buf, n = tok(u)
            ntok += n
            if mode == "whole" and ids is None:
                ids = buf[:n]
        best = min(best, time.process_time() - t0)
    return {"impl": "llama.cpp", "mode": mode, "bytes": len(data), "tokens": ntok,
            "seconds": round(best, 4), "mb_per_s": round(len(data) / best / 1e6, 2)}, ids


def check_pieces(exe, model, tok):
    """Every token's piece (token_to_piece with special=True) against llama.cpp's."""
    import llama_cpp
    vocab = tok.__defaults__[0]._model.vocab
    mine = subprocess.run([exe, model, "--pieces"], check=True, capture_output=True,
                          text=True).stdout.split("\n")
    n = llama_cpp.llama_vocab_n_tokens(vocab)
    buf = ctypes.create_string_buffer(1 << 16)
    bad = []
    for i in range(n):
        k = llama_cpp.llama_token_to_piece(vocab, i, buf, len(buf), 0, True)
        if buf.raw[:k].hex() != mine[i]:
            bad.append(i)
    print("pieces identical to llama.cpp: %s (%d tokens, %d differ%s)" %
          ("yes" if not bad else "NO", n, len(bad), (": " + str(bad[:10])) if bad else ""))
    return not bad


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--model", default=default_model())
    ap.add_argument("--corpus", default="/tmp/medley-tok-corpus.txt")
    ap.add_argument("--mb", default="12")
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    if not os.path.exists(a.corpus):
        subprocess.run([sys.executable, os.path.join(HERE, "make_corpus.py"), a.corpus, a.mb],
                       check=True)
    data = open(a.corpus, "rb").read()
    exe = os.path.join(a.build, "bench_tok")
    build_bench(a.build, exe)
    tok, version = llama_tokenize_timer(a.model)
    print("corpus %s: %d bytes; model %s; llama-cpp-python %s" %
          (a.corpus, len(data), os.path.basename(a.model), version))
    ids_file = a.corpus + ".medley-ids"
    agree = None
    for mode in ("whole", "lines"):
        args = [exe, a.model, a.corpus, mode, str(a.repeats)] + ([ids_file] if mode == "whole" else [])
        med = json.loads(subprocess.run(args, check=True, capture_output=True, text=True).stdout)
        ref, ref_ids = time_llama(tok, data, mode, a.repeats)
        if mode == "whole":
            mine = [int(x) for x in open(ids_file)]
            agree = mine == list(ref_ids)
            if not agree:
                first = next((i for i, (x, y) in enumerate(zip(mine, ref_ids)) if x != y),
                             min(len(mine), len(ref_ids)))
                print("MISMATCH on the whole text at token %d: medley %s llama.cpp %s" %
                      (first, mine[first:first + 8], list(ref_ids[first:first + 8])))
        print("%-6s medley %8.2f MB/s (%d tokens, %.3f cpu-s)   llama.cpp %8.2f MB/s (%d tokens, "
              "%.3f cpu-s)   ratio %.2fx" % (mode, med["mb_per_s"], med["tokens"], med["seconds"],
                                          ref["mb_per_s"], ref["tokens"], ref["seconds"],
                                          med["mb_per_s"] / ref["mb_per_s"]))
    print("whole-text ids identical to llama.cpp: %s" % ("yes" if agree else "NO"))
    same_pieces = check_pieces(exe, a.model, tok)
    return 0 if agree and same_pieces else 1


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""medley's CPU engine against llama.cpp (llama-cpp-python), same GGUF, same thread count,
measured in one run. Three cases:

  decode   single-sequence decode tokens/s (16-token prompt, 128 greedy tokens, EOS ignored)
  prefill  prompt processing tokens/s of a 512-token prompt (one sequence, logits of the
           last token only, as both engines do for a prompt)
  batched  64 concurrent requests of 256 prompt tokens (a shared 64-token system prompt +
           192 own tokens) and 128 generated tokens each; total throughput
           (prompt + generated tokens) / wall seconds. llama.cpp runs in its batched mode:
           the system prompt is decoded once in sequence 0 and copied to the 63 others
           (llama_memory_seq_cp), then every step decodes one token of each live sequence
           in one llama_batch, as llama.cpp's examples/batched does.

Each engine runs in its own process (peak RSS = that process's ru_maxrss), the two
alternate, each case runs --reps times and the best run of each engine is kept (the
machine may be shared: the best run is the least disturbed one).

  python3 bench/engine/bench_engine.py --medley build/cli/medley \\
      --model ~/.cache/medley/models/SmolLM2-135M-Instruct.Q4_1.gguf [--threads N] [--reps 3]

--model also takes a registered name (`medley models path NAME` resolves it). Gemma 3 270M
(Q4_K_M; sliding-window layers, GeGLU) is measured on decode, the case the issue sets:
  python3 bench/engine/bench_engine.py --model gemma3-270m --cases decode

Needs llama-cpp-python (pip install llama-cpp-python==0.3.36, built from PyPI) and numpy.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

N_DECODE = 128
N_PREFILL = 512
N_REQ, N_SYS, N_USER, N_GEN = 64, 64, 192, 128

WORDS = ("river stone light market garden winter paper engine window silver morning "
         "harbor letter forest bridge candle mountain orchard lantern meadow signal "
         "village thunder compass ribbon anchor planet saddle marble copper feather "
         "island quiet golden narrow ancient hollow distant gentle bright steady").split()


def words(seed, n):
    """Deterministic filler text of n words."""
    x, out = seed * 2654435761 % 2**32 or 1, []
    for _ in range(n):
        x = (x * 1103515245 + 12345) % 2**31
        out.append(WORDS[x % len(WORDS)])
    return " ".join(out)


# ---------------------------------------------------------------- llama.cpp side (child)

class Peer:
    def __init__(self, model, threads, n_ctx, n_seq, unified):
        import llama_cpp as L
        import numpy as np
        self.L, self.np = L, np
        L.llama_backend_init()
        self._log_cb = L.llama_log_callback(lambda *a: None)  # kept alive: C holds it
        L.llama_log_set(self._log_cb, None)
        mp = L.llama_model_default_params()
        self.model = L.llama_model_load_from_file(model.encode(), mp)
        if not self.model:
            raise SystemExit(f"llama.cpp cannot load {model}")
        self.vocab = L.llama_model_get_vocab(self.model)
        self.n_vocab = L.llama_vocab_n_tokens(self.vocab)
        cp = L.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch = n_ctx, 512, 512
        cp.n_seq_max = n_seq
        cp.n_threads = cp.n_threads_batch = threads
        cp.kv_unified = unified
        cp.no_perf = True
        self.ctx = L.llama_init_from_model(self.model, cp)
        if not self.ctx:
            raise SystemExit("llama.cpp cannot create a context")
        self.mem = L.llama_get_memory(self.ctx)
        self.batch = L.llama_batch_init(512, 0, 1)

    def tokenize(self, text):
        L = self.L
        buf = (L.llama_token * (len(text) + 16))()
        n = L.llama_tokenize(self.vocab, text.encode(), len(text.encode()), buf, len(buf),
                             False, True)
        if n < 0:
            raise SystemExit("llama.cpp tokenize failed")
        return list(buf[:n])

    def decode(self, items):
        """items: (token, pos, seq, want_logits). Returns logits rows (numpy) of the wanted."""
        b = self.batch
        b.n_tokens = len(items)
        for i, (tok, pos, seq, want) in enumerate(items):
            b.token[i], b.pos[i], b.n_seq_id[i] = tok, pos, 1
            b.seq_id[i][0] = seq
            b.logits[i] = want
        if self.L.llama_decode(self.ctx, b) != 0:
            raise SystemExit("llama_decode failed")

    def argmax(self, i):
        ptr = self.L.llama_get_logits_ith(self.ctx, i)
        return int(self.np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).argmax())

    def argmax_all(self, n):
        ptr = self.L.llama_get_logits(self.ctx)
        return self.np.ctypeslib.as_array(ptr, shape=(n, self.n_vocab)).argmax(axis=1).tolist()

    def prefill(self, toks, seq=0, pos0=0):
        for s in range(0, len(toks), 512):
            chunk = toks[s:s + 512]
            self.decode([(t, pos0 + s + i, seq, s + i == len(toks) - 1)
                         for i, t in enumerate(chunk)])


def peer_case(case, model, threads, prompts):
    if case == "decode":
        p = Peer(model, threads, 512, 1, False)
        toks = p.tokenize(prompts["decode"])
        p.prefill(toks)
        tok, pos = p.argmax(-1), len(toks)
        t0 = time.perf_counter()
        for _ in range(N_DECODE):
            p.decode([(tok, pos, 0, True)])
            tok, pos = p.argmax(0), pos + 1
        dt = time.perf_counter() - t0
        return {"tokens_per_s": N_DECODE / dt, "tokens": N_DECODE}
    if case == "prefill":
        p = Peer(model, threads, 1024, 1, False)
        toks = p.tokenize(prompts["prefill"])
        t0 = time.perf_counter()
        p.prefill(toks)
        p.argmax(-1)
        dt = time.perf_counter() - t0
        return {"tokens_per_s": len(toks) / dt, "tokens": len(toks)}
    # batched
    p = Peer(model, threads, N_REQ * (N_SYS + N_USER + N_GEN) + 256, N_REQ, True)
    t0 = time.perf_counter()
    sys_toks = p.tokenize(prompts["system"])
    reqs = [p.tokenize(prompts["system"] + u) for u in prompts["users"]]
    for r in reqs:
        if r[:len(sys_toks)] != sys_toks:
            raise SystemExit("system prompt does not tokenize as a prefix")
    p.prefill(sys_toks, seq=0)
    for s in range(1, N_REQ):
        p.L.llama_memory_seq_cp(p.mem, 0, s, -1, -1)
    # the requests' own tokens, packed into 512-token batches across sequences
    pending = [(t, len(sys_toks) + i, s, i == len(r) - len(sys_toks) - 1)
               for s, r in enumerate(reqs) for i, t in enumerate(r[len(sys_toks):])]
    nxt, pos = [0] * N_REQ, [len(r) for r in reqs]
    for b0 in range(0, len(pending), 512):
        chunk = pending[b0:b0 + 512]
        p.decode(chunk)
        for i, (_, _, s, want) in enumerate(chunk):
            if want:
                nxt[s] = p.argmax(i)
    generated = N_REQ  # the first token of each came from its prompt's logits
    for _ in range(N_GEN - 1):
        p.decode([(nxt[s], pos[s], s, True) for s in range(N_REQ)])
        nxt = p.argmax_all(N_REQ)
        pos = [x + 1 for x in pos]
        generated += N_REQ
    dt = time.perf_counter() - t0
    prompt_tokens = sum(len(r) for r in reqs)
    return {"tokens_per_s": (prompt_tokens + generated) / dt, "prompt_tokens": prompt_tokens,
            "generated": generated, "seconds": dt}


# ---------------------------------------------------------------- medley side

def medley_case(case, args, prompts, tmp):
    base = [args.medley, "generate", "-m", args.model, "-t", str(args.threads)]
    if case == "decode":
        cmd = base + ["-p", prompts["decode"], "-n", str(N_DECODE), "--ignore-eos", "--json"]
    elif case == "prefill":
        cmd = base + ["-p", prompts["prefill"], "-n", "1", "--json"]
    else:
        path = os.path.join(tmp, "batch.jsonl")
        with open(path, "w") as f:
            for i, u in enumerate(prompts["users"]):
                f.write(json.dumps({"custom_id": f"r{i}", "prompt": prompts["system"] + u,
                                    "max_tokens": N_GEN}) + "\n")
        cmd = base + ["--batch", path, "--ignore-eos", "--max-seqs", str(N_REQ), "-o", os.devnull]
    out, err, rss = run(cmd)
    if case == "batched":
        m = re.search(r"(\d+) prompt \+ (\d+) generated tokens in ([\d.]+) s: .*?([\d.]+) total tok/s", err)
        if not m:
            raise SystemExit(f"medley batch output not understood:\n{err}")
        return {"tokens_per_s": float(m.group(4)), "prompt_tokens": int(m.group(1)),
                "generated": int(m.group(2)), "seconds": float(m.group(3))}, rss
    j = json.loads(out)
    t = j["timings"]
    if case == "decode":
        return {"tokens_per_s": t["decode_tokens_per_s"], "tokens": j["completion_tokens"]}, rss
    return {"tokens_per_s": t["prompt_tokens_per_s"], "tokens": j["prompt_tokens"]}, rss


def run(cmd):
    """Run cmd; return stdout, stderr and its peak RSS in MiB."""
    with tempfile.TemporaryFile() as fo, tempfile.TemporaryFile() as fe:
        proc = subprocess.Popen(cmd, stdout=fo, stderr=fe)
        _, status, ru = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        fo.seek(0)
        fe.seek(0)
        out, err = fo.read().decode(), fe.read().decode()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:3])} ... failed ({proc.returncode}):\n{err[-2000:]}")
    return out, err, ru.ru_maxrss / 1024.0


def make_prompts():
    """Texts of exactly the case's token counts for SmolLM2's tokenizer (every filler word is
    one token; checked by both engines' reported counts)."""
    return {
        "decode": "Write a short story about a lighthouse keeper who finds a message in a bottle.",
        "prefill": words(7, N_PREFILL),
        "system": "You are a careful assistant. Answer in plain words. Context: " + words(1, 50)
                  + "\n",
        "users": [f"Request {i:02d}: " + words(100 + i, N_USER - 5) for i in range(N_REQ)],
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--medley", default="build/cli/medley")
    ap.add_argument("--model", default=os.path.expanduser(
        "~/.cache/medley/models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--cases", default="decode,prefill,batched")
    ap.add_argument("--peer-child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if not os.path.isfile(args.model):  # a registered name: its file in the models directory
        out, _, _ = run([args.medley, "models", "path", args.model])
        args.model = out.strip()
    prompts = make_prompts()
    if args.peer_child:
        print(json.dumps(peer_case(args.peer_child, args.model, args.threads, prompts)))
        return
    targets = {"decode": 1.0, "prefill": 1.0, "batched": 1.5}
    print(f"# medley vs llama.cpp (llama-cpp-python), {os.path.basename(args.model)}, "
          f"{args.threads} threads, best of {args.reps}, {time.strftime('%Y-%m-%d %H:%M')}")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for case in args.cases.split(","):
            best_m, best_p = None, None
            for _ in range(args.reps):
                m, m_rss = medley_case(case, args, prompts, tmp)
                print(f"  {case}: medley {m}, peak {m_rss:.0f} MiB", flush=True)
                out, _, p_rss = run([sys.executable, os.path.abspath(__file__), "--peer-child",
                                     case, "--model", args.model, "--threads", str(args.threads)])
                p = json.loads(out.strip().splitlines()[-1])
                if best_m is None or m["tokens_per_s"] > best_m[0]["tokens_per_s"]:
                    best_m = (m, m_rss)
                if best_p is None or p["tokens_per_s"] > best_p[0]["tokens_per_s"]:
                    best_p = (p, p_rss)
                print(f"  {case}: llama.cpp {p}, peak {p_rss:.0f} MiB", flush=True)
            rows.append((case, best_m, best_p))
    print(f"{'case':8} {'medley tok/s':>13} {'llama.cpp tok/s':>16} {'ratio':>7} {'target':>7} "
          f"{'medley MiB':>11} {'llama MiB':>10}")
    for case, (m, mr), (p, pr) in rows:
        ratio = m["tokens_per_s"] / p["tokens_per_s"]
        print(f"{case:8} {m['tokens_per_s']:13.1f} {p['tokens_per_s']:16.1f} {ratio:6.2f}x "
              f"{targets[case]:6.1f}x {mr:11.0f} {pr:10.0f}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Batch throughput on issue 41's workloads: medley (this build) against another medley build
(--before, e.g. main built in a separate directory) and llama.cpp (llama-cpp-python) when the
interpreter can import it, measured in one run, runs alternated.

  A  64 x (256 prompt + 128 generated)
  B  32 x (1,500 prompt + 128 generated), document-shaped
  C   1 x (16 prompt + 128 generated), decode only
  D  64 documents of ~2,000 tokens, 200 generated each (the document-shaped case)

Prompts are filler words generated here (each word one SmolLM2 token; other tokenizers give
other counts: the prompt tokens each engine reports are printed), greedy, EOS ignored, every
engine on the same model file with the same thread count. medley runs `medley generate
--batch` (continuous batching, chunked prefill); llama.cpp runs in its batched mode: every
sequence's prompt packed into 512-token llama_batch calls, then one step per generated token
holding a token of every live sequence (bench_engine.py's Peer). Tokens/s is (prompt +
generated) / wall seconds of the generation (model load excluded); on a shared machine the
steadier figure is tokens per CPU second of the process (user + system), also printed.

  python3 bench/engine/bench_workloads.py --medley build/cli/medley \\
      --before /path/to/main/build/cli/medley --workloads A,B,C,D --reps 2 [--scale 0.25]

--scale multiplies the number of requests of A, B and D (at least 1): the full workloads take
tens of minutes per engine on a 2-core machine. vLLM's CPU backend is not run here (see
docs/benchmarks.md: too heavy to install on the shared development machine).
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_engine import words  # noqa: E402  (the same filler text as the other cases)

WORKLOADS = {  # requests, prompt words, generated tokens
    "A": (64, 256, 128),
    "B": (32, 1500, 128),
    "C": (1, 16, 128),
    "D": (64, 2000, 200),
}


def prompts_for(w, scale):
    n, plen, gen = WORKLOADS[w]
    if w != "C":
        n = max(1, int(round(n * scale)))
    out = []
    for i in range(n):
        head = f"Document {i:03d}. " if w in "BD" else f"Request {i:03d}: "
        out.append(head + words(1000 * (ord(w) - 64) + i, plen - 4))
    return out, gen


def run(cmd):
    """Run cmd; return stdout, stderr, CPU seconds (user + system) and peak RSS in MiB."""
    with tempfile.TemporaryFile() as fo, tempfile.TemporaryFile() as fe:
        proc = subprocess.Popen(cmd, stdout=fo, stderr=fe)
        _, status, ru = os.wait4(proc.pid, 0)
        rc = os.waitstatus_to_exitcode(status)
        fo.seek(0)
        fe.seek(0)
        out, err = fo.read().decode(), fe.read().decode()
    if rc != 0:
        raise SystemExit(f"{' '.join(cmd[:3])} ... failed ({rc}):\n{err[-2000:]}")
    return out, err, ru.ru_utime + ru.ru_stime, ru.ru_maxrss / 1024.0


def medley_run(binary, args, w, tmp):
    prompts, gen = prompts_for(w, args.scale)
    path = os.path.join(tmp, f"{w}.jsonl")
    with open(path, "w") as f:
        for i, p in enumerate(prompts):
            f.write(json.dumps({"custom_id": f"r{i}", "prompt": p, "max_tokens": gen}) + "\n")
    n_tok = len(prompts) * (len(prompts[0].split()) + 8 + gen)
    kv_mb = max(256, n_tok * 30 * 2 * 192 * 2 // (1 << 20) + 64)  # F16 K+V, SmolLM2-sized
    cmd = [binary, "generate", "-m", args.model, "-t", str(args.threads), "--batch", path,
           "--ignore-eos", "--max-seqs", str(len(prompts)), "--kv-mb", str(kv_mb),
           "-o", os.devnull]
    _, err, cpu, rss = run(cmd)
    m = re.search(r"(\d+) prompt \+ (\d+) generated tokens in ([\d.]+) s", err)
    if not m:
        raise SystemExit(f"medley batch output not understood:\n{err[-2000:]}")
    p, g, s = int(m.group(1)), int(m.group(2)), float(m.group(3))
    return {"prompt": p, "generated": g, "seconds": s, "tok_s": (p + g) / s,
            "tok_cpu_s": (p + g) / cpu, "rss": rss}


def peer_child(args):
    """llama.cpp side (a child process): the workload in batched mode; prints one JSON line."""
    from bench_engine import Peer
    prompts, gen = prompts_for(args.peer_child, args.scale)
    n = len(prompts)
    # context: every sequence's prompt and output (unified KV), plus slack
    probe = Peer(args.model, args.threads, 512, 1, False)
    reqs = [probe.tokenize(t) for t in prompts]
    del probe
    n_ctx = sum(len(r) for r in reqs) + n * gen + 256
    p = Peer(args.model, args.threads, n_ctx, n, True)
    t0 = time.perf_counter()
    c0 = time.process_time()
    pending = [(t, i, s, i == len(r) - 1) for s, r in enumerate(reqs) for i, t in enumerate(r)]
    nxt, pos = [0] * n, [len(r) for r in reqs]
    for b0 in range(0, len(pending), 512):
        chunk = pending[b0:b0 + 512]
        p.decode(chunk)
        for i, (_, _, s, want) in enumerate(chunk):
            if want:
                nxt[s] = p.argmax(i)
    generated = n
    for _ in range(gen - 1):
        p.decode([(nxt[s], pos[s], s, True) for s in range(n)])
        nxt = p.argmax_all(n)
        pos = [x + 1 for x in pos]
        generated += n
    dt = time.perf_counter() - t0
    cpu = time.process_time() - c0
    pt = sum(len(r) for r in reqs)
    print(json.dumps({"prompt": pt, "generated": generated, "seconds": dt,
                      "tok_s": (pt + generated) / dt, "tok_cpu_s": (pt + generated) / cpu}))


def have_llama(python):
    try:
        subprocess.run([python, "-c", "import llama_cpp"], check=True, capture_output=True)
        return True
    except (subprocess.CalledProcessError, OSError):
        return False


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--medley", default="build/cli/medley")
    ap.add_argument("--before", help="another medley binary (the baseline), run alternately")
    ap.add_argument("--model", default=os.path.expanduser(
        "~/.cache/medley/models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--workloads", default="A,B,C,D")
    ap.add_argument("--llama-python", default="/opt/medley-venv/bin/python",
                    help="interpreter with llama-cpp-python (skipped when it cannot import it)")
    ap.add_argument("--peer-child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if not os.path.isfile(args.model):
        out, _, _, _ = run([args.medley, "models", "path", args.model])
        args.model = out.strip()
    if args.peer_child:
        peer_child(args)
        return
    engines = [("medley", args.medley)]
    if args.before:
        engines.append(("before", args.before))
    if have_llama(args.llama_python):
        engines.append(("llama.cpp", None))
    else:
        print(f"# llama.cpp skipped: {args.llama_python} cannot import llama_cpp "
              "(pip install llama-cpp-python==0.3.36 into it)")
    print("# vLLM CPU: not run (not installed on this machine; docs/benchmarks.md)")
    print(f"# {os.path.basename(args.model)}, {args.threads} threads, scale {args.scale}, "
          f"best of {args.reps}, {time.strftime('%Y-%m-%d %H:%M')}, load {os.getloadavg()}")
    table = []
    with tempfile.TemporaryDirectory() as tmp:
        for w in args.workloads.split(","):
            best = {}
            for rep in range(args.reps):
                for name, binary in engines:
                    if binary:
                        r = medley_run(binary, args, w, tmp)
                    else:
                        out, _, _, rss = run([args.llama_python, os.path.abspath(__file__),
                                              "--peer-child", w, "--model", args.model,
                                              "--threads", str(args.threads),
                                              "--scale", str(args.scale)])
                        r = json.loads(out.strip().splitlines()[-1])
                        r["rss"] = rss
                    print(f"  {w} rep {rep} {name:9}: {r['prompt']} prompt + {r['generated']} "
                          f"generated in {r['seconds']:.1f} s: {r['tok_s']:.1f} tok/s, "
                          f"{r['tok_cpu_s']:.1f} tok per CPU s, {r['rss']:.0f} MiB "
                          f"(load {os.getloadavg()[0]:.1f})", flush=True)
                    if name not in best or r["tok_cpu_s"] > best[name]["tok_cpu_s"]:
                        best[name] = r
            table.append((w, best))
    names = [n for n, _ in engines]
    print(f"{'workload':9}" + "".join(f"{n + ' tok/s':>17}{'per CPU s':>11}" for n in names)
          + "".join(f"{'vs ' + n:>12}" for n in names[1:]))
    for w, best in table:
        line = f"{w:9}"
        for n in names:
            line += f"{best[n]['tok_s']:17.1f}{best[n]['tok_cpu_s']:11.1f}"
        for n in names[1:]:
            line += f"{best['medley']['tok_cpu_s'] / best[n]['tok_cpu_s']:11.2f}x"
        print(line)
    print("(ratios: medley's tokens per CPU second over the other engine's, best runs)")


if __name__ == "__main__":
    main()

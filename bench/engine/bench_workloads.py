#!/usr/bin/env python3
"""Batch throughput on issue 41's workloads: medley (this build) against another medley build
(--before, e.g. main built in a separate directory), llama.cpp (llama-cpp-python) and vLLM's CPU
backend when their interpreters can import them, measured in one run, runs alternated.

  A  64 x (256 prompt + 128 generated)
  B  32 x (1,500 prompt + 128 generated), document-shaped
  C   1 x (16 prompt + 128 generated), decode only
  D  64 documents of ~2,000 tokens, 200 generated each (the document-shaped case)

Prompts are filler words generated here (each word about one SmolLM2 token), tokenized once
by `medley tokenize` with the model file's tokenizer; every engine gets those token ids
(medley as `{"prompt": [ids]}` batch lines), so prompt counts are equal by construction and
checked against what each engine reports. Greedy, EOS ignored, the same thread count for
every engine. medley runs `medley generate --batch` (continuous batching, chunked prefill);
llama.cpp runs in its batched mode: every sequence's prompt packed into 512-token
llama_batch calls, then one step per generated token holding a token of every live sequence
(bench_engine.py's Peer). vLLM (--vllm-python, the venv of install_vllm_cpu.sh) runs offline
`LLM(model=HF_DIR, dtype=bfloat16).generate` on every request at once, on --hf-dir: the same
weights dequantized to BF16 by gguf_to_hf.py (vLLM's CPU backend does not read Q4 GGUF);
`--hf-dir` also runs medley on that directory ("medley-bf16"), the like-for-like row. Tokens/s
is (prompt + generated) / wall seconds of the generation (model load excluded, printed apart);
on a shared machine the steadier figure is tokens per CPU second of the engine's processes
(user + system), also printed.

  python3 bench/engine/bench_workloads.py --medley build/cli/medley \\
      --before /path/to/main/build/cli/medley --workloads A,B,C,D --reps 2 [--scale 0.25] \\
      [--hf-dir /tmp/smollm2-135m-bf16]

--scale multiplies the number of requests of A, B and D (at least 1): the full workloads take
tens of minutes per engine on a 2-core machine.
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

RESULT = "bench_workloads result: "  # a child's result line (vLLM logs on stdout too)
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


def run(cmd, env=None):
    """Run cmd; return stdout, stderr, CPU seconds (user + system, with the children it
    waited for), peak RSS in MiB and wall seconds."""
    with tempfile.TemporaryFile() as fo, tempfile.TemporaryFile() as fe:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=fo, stderr=fe, env=env)
        _, status, ru = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        rc = os.waitstatus_to_exitcode(status)
        fo.seek(0)
        fe.seek(0)
        out, err = fo.read().decode(), fe.read().decode()
    if rc != 0:
        raise SystemExit(f"{' '.join(cmd[:3])} ... failed ({rc}):\n{err[-3000:]}")
    return out, err, ru.ru_utime + ru.ru_stime, ru.ru_maxrss / 1024.0, wall


def tokenize(medley, model, w, scale, tmp):
    """Workload w's prompts as token ids (medley's tokenizer of the model file, BOS as the
    model asks, as `medley generate` would encode the text), written to tmp/W.ids.json;
    returns that path, the ids and the generated tokens per request."""
    prompts, gen = prompts_for(w, scale)
    cmd = [medley, "tokenize", "-m", model, "--jsonl", "--ids", "-"]
    proc = subprocess.run(cmd, input="".join(json.dumps(p) + "\n" for p in prompts),
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"medley tokenize failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    ids = [[int(t) for t in line.split()] for line in proc.stdout.splitlines()]
    if len(ids) != len(prompts) or not all(ids):
        raise SystemExit(f"medley tokenize: {len(ids)} id lines for {len(prompts)} prompts")
    path = os.path.join(tmp, f"{w}.ids.json")
    with open(path, "w") as f:
        json.dump({"ids": ids, "gen": gen}, f)
    return path, ids, gen


def medley_run(binary, model, args, ids, gen, tmp):
    path = os.path.join(tmp, "batch.jsonl")
    with open(path, "w") as f:
        for i, p in enumerate(ids):
            f.write(json.dumps({"custom_id": f"r{i}", "prompt": p, "max_tokens": gen}) + "\n")
    n_tok = sum(len(p) + gen + 16 for p in ids)
    kv_mb = max(256, n_tok * 30 * 2 * 192 * 2 // (1 << 20) + 64)  # F16 K+V, SmolLM2-sized
    if args.kv_mb:
        kv_mb = args.kv_mb
    cmd = [binary, "generate", "-m", model, "-t", str(args.threads), "--batch", path,
           "--ignore-eos", "--max-seqs", str(len(ids)), "--kv-mb", str(kv_mb),
           "-o", os.devnull]
    _, err, cpu, rss, wall = run(cmd)
    m = re.search(r"(\d+) prompt \+ (\d+) generated tokens in ([\d.]+) s", err)
    if not m:
        raise SystemExit(f"medley batch output not understood:\n{err[-2000:]}")
    p, g, s = int(m.group(1)), int(m.group(2)), float(m.group(3))
    return {"prompt": p, "generated": g, "seconds": s, "tok_s": (p + g) / s,
            "tok_cpu_s": (p + g) / cpu, "rss": rss, "load_s": wall - s}


def load_ids(path):
    with open(path) as f:
        d = json.load(f)
    return d["ids"], d["gen"]


def llama_child(args):
    """llama.cpp side (a child process): the workload in batched mode; prints one JSON line."""
    from bench_engine import Peer
    reqs, gen = load_ids(args.ids)
    n = len(reqs)
    # context: every sequence's prompt and output (unified KV), plus slack
    n_ctx = sum(len(r) for r in reqs) + n * gen + 256
    t0 = time.perf_counter()
    p = Peer(args.model, args.threads, n_ctx, n, True)
    load_s = time.perf_counter() - t0
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
    print(RESULT + json.dumps({"prompt": pt, "generated": generated, "seconds": dt,
                               "tok_s": (pt + generated) / dt,
                               "tok_cpu_s": (pt + generated) / cpu, "load_s": load_s}),
          flush=True)


def tree_cpu():
    """CPU seconds (user + system) of this process and every live descendant: vLLM runs its
    engine core in a child process."""
    import psutil
    me = psutil.Process()
    total = 0.0
    for p in [me] + me.children(recursive=True):
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def vllm_child(args):
    """vLLM side (a child process under --vllm-python, environment set by vllm_env): offline
    LLM.generate on every request's token ids at once; prints one JSON line."""
    from vllm import LLM, SamplingParams
    reqs, gen = load_ids(args.ids)
    t0 = time.perf_counter()
    # one max_model_len for every workload (and vLLM's default max_num_seqs, 256): the same
    # engine config, so its torch.compile cache (~/.cache/vllm) serves every load after the
    # first
    llm = LLM(model=args.model, dtype="bfloat16",
              max_model_len=max(4096, max(map(len, reqs)) + gen + 16), seed=0)
    load_s = time.perf_counter() - t0
    sp = SamplingParams(temperature=0, max_tokens=gen, ignore_eos=True)
    prompts = [{"prompt_token_ids": r} for r in reqs]
    c0 = tree_cpu()
    t0 = time.perf_counter()
    outs = llm.generate(prompts, sp, use_tqdm=False)
    dt = time.perf_counter() - t0
    cpu = tree_cpu() - c0
    pt = sum(len(o.prompt_token_ids) for o in outs)
    generated = sum(len(o.outputs[0].token_ids) for o in outs)
    print(RESULT + json.dumps({"prompt": pt, "generated": generated, "seconds": dt,
                               "tok_s": (pt + generated) / dt,
                               "tok_cpu_s": (pt + generated) / cpu, "load_s": load_s,
                               "first": list(outs[0].outputs[0].token_ids[:8])}), flush=True)


def vllm_env(args, ids, gen):
    """The environment vLLM's CPU docs ask for: tcmalloc and Intel's OpenMP preloaded, the
    OpenMP threads bound to --threads cores, a KV cache that holds the whole batch."""
    env = dict(os.environ)
    venv = os.path.dirname(os.path.dirname(args.vllm_python))
    pre = [args.tcmalloc, os.path.join(venv, "lib", "libiomp5.so")]
    missing = [p for p in pre if not os.path.isfile(p)]
    if missing:
        raise SystemExit(f"vLLM: {missing} not found (install_vllm_cpu.sh installs them)")
    env["LD_PRELOAD"] = ":".join(pre)
    cores = sorted(os.sched_getaffinity(0))[:args.threads]
    env["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(map(str, cores))
    with open(os.path.join(args.hf_dir, "config.json")) as f:
        c = json.load(f)
    c = c.get("text_config", c)
    hd = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    per_tok = c["num_hidden_layers"] * 2 * c["num_key_value_heads"] * hd * 2  # BF16 K+V
    # vLLM 0.32.0's CPU cache held 10,556 SmolLM2 tokens per GiB, 4.4x these BF16 K+V bytes
    # (measured, not explained): 5x, so that the whole batch fits, as medley's budget does
    need = sum(len(r) + gen + 16 for r in ids) * per_tok * 5
    gib = max(1, -(-need // (1 << 30)))
    if args.vllm_kv_gib:
        gib = args.vllm_kv_gib
    elif gib > mem_available_gib() // 2:
        gib = max(1, mem_available_gib() // 2)
        print(f"# vLLM: KV cache {gib} GiB, half the available memory, less than the "
              f"{-(-need // (1 << 30))} GiB the whole batch needs: vLLM runs fewer at once")
    env["VLLM_CPU_KVCACHE_SPACE"] = str(gib)
    env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env


def mem_available_gib():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) // (1 << 20)
    return 0


def can_import(python, module):
    try:
        subprocess.run([python, "-c", f"import {module}"], check=True, capture_output=True)
        return True
    except (subprocess.CalledProcessError, OSError):
        return False


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--medley", default="build/cli/medley")
    ap.add_argument("--before", help="another medley binary (the baseline), run alternately")
    ap.add_argument("--model", default=os.path.expanduser(
        "~/.cache/medley/models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--hf-dir", help="the model as a BF16 Hugging Face directory "
                    "(gguf_to_hf.py): vLLM's model, and a medley-bf16 row")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--workloads", default="A,B,C,D")
    ap.add_argument("--kv-mb", type=int, default=0,
                    help="medley's KV budget (default: what the whole batch needs, "
                         "SmolLM2-sized)")
    ap.add_argument("--llama-python", default="/opt/medley-venv/bin/python",
                    help="interpreter with llama-cpp-python (skipped when it cannot import it)")
    ap.add_argument("--vllm-python", default="/opt/vllm-venv/bin/python",
                    help="interpreter with vLLM's CPU backend (install_vllm_cpu.sh; skipped "
                         "when it cannot import vllm or no --hf-dir is given)")
    ap.add_argument("--vllm-kv-gib", type=int, default=0,
                    help="VLLM_CPU_KVCACHE_SPACE (default: what the whole batch needs, at most "
                         "half the available memory)")
    ap.add_argument("--tcmalloc", default="/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4",
                    help="preloaded for vLLM, as its CPU docs advise")
    ap.add_argument("--llama-child", help=argparse.SUPPRESS)
    ap.add_argument("--vllm-child", help=argparse.SUPPRESS)
    ap.add_argument("--ids", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.vllm_child:
        vllm_child(args)
        return
    if not os.path.exists(args.model):
        out, _, _, _, _ = run([args.medley, "models", "path", args.model])
        args.model = out.strip()
    if args.llama_child:
        llama_child(args)
        return
    engines = [("medley", args.medley, args.model)]
    if args.before:
        engines.append(("before", args.before, args.model))
    if args.hf_dir:
        args.hf_dir = os.path.abspath(args.hf_dir)
        engines.append(("medley-bf16", args.medley, args.hf_dir))
    if can_import(args.llama_python, "llama_cpp"):
        engines.append(("llama.cpp", None, args.model))
    else:
        print(f"# llama.cpp skipped: {args.llama_python} cannot import llama_cpp "
              "(pip install llama-cpp-python==0.3.36 into it)")
    if not args.hf_dir:
        print("# vLLM skipped: no --hf-dir (gguf_to_hf.py makes the BF16 directory it reads)")
    elif not can_import(args.vllm_python, "vllm"):
        print(f"# vLLM skipped: {args.vllm_python} cannot import vllm "
              "(bash bench/engine/install_vllm_cpu.sh)")
    else:
        engines.append(("vLLM", None, args.hf_dir))
    print(f"# {os.path.basename(args.model)}"
          + (f" (BF16 dir {args.hf_dir})" if args.hf_dir else "")
          + f", {args.threads} threads, scale {args.scale}, best of {args.reps}, "
          f"{time.strftime('%Y-%m-%d %H:%M')}, load {os.getloadavg()}")
    me = os.path.abspath(__file__)
    table = []
    with tempfile.TemporaryDirectory() as tmp:
        for w in args.workloads.split(","):
            ids_path, ids, gen = tokenize(args.medley, args.model, w, args.scale, tmp)
            want = sum(map(len, ids))
            best = {}
            for rep in range(args.reps):
                for name, binary, model in engines:
                    if binary:
                        r = medley_run(binary, model, args, ids, gen, tmp)
                    else:
                        py, flag, env = args.llama_python, "--llama-child", None
                        if name == "vLLM":
                            py, flag, env = args.vllm_python, "--vllm-child", vllm_env(
                                args, ids, gen)
                        out, _, _, rss, _ = run([py, me, flag, w, "--model", model, "--ids",
                                                 ids_path, "--threads", str(args.threads)],
                                                env=env)
                        got = [x for x in out.splitlines() if x.startswith(RESULT)]
                        if not got:
                            raise SystemExit(f"{name} printed no result:\n{out[-2000:]}")
                        r = json.loads(got[-1][len(RESULT):])
                        r["rss"] = rss
                    if r["prompt"] != want or r["generated"] != len(ids) * gen:
                        raise SystemExit(f"{name} on {w}: {r['prompt']} prompt + "
                                         f"{r['generated']} generated tokens, expected {want} + "
                                         f"{len(ids) * gen}")
                    print(f"  {w} rep {rep} {name:11}: {r['prompt']} prompt + {r['generated']} "
                          f"generated in {r['seconds']:.1f} s: {r['tok_s']:.1f} tok/s, "
                          f"{r['tok_cpu_s']:.1f} tok per CPU s, load {r['load_s']:.1f} s, "
                          f"{r['rss']:.0f} MiB (load avg {os.getloadavg()[0]:.1f})"
                          + (f", first tokens {r['first']}" if "first" in r else ""),
                          flush=True)
                    if name not in best or r["tok_cpu_s"] > best[name]["tok_cpu_s"]:
                        best[name] = r
            table.append((w, best))
    names = [n for n, _, _ in engines]
    print(f"{'workload':9}" + "".join(f"{n + ' tok/s':>20}{'per CPU s':>11}" for n in names)
          + "".join(f"{'vs ' + n:>16}" for n in names[1:]))
    for w, best in table:
        line = f"{w:9}"
        for n in names:
            line += f"{best[n]['tok_s']:20.1f}{best[n]['tok_cpu_s']:11.1f}"
        for n in names[1:]:
            line += f"{best['medley']['tok_cpu_s'] / best[n]['tok_cpu_s']:15.2f}x"
        print(line)
    print("(ratios: medley's tokens per CPU second over the other engine's, best runs; "
          "medley's CPU seconds include its model load, the peers' do not)")


if __name__ == "__main__":
    main()

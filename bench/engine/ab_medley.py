#!/usr/bin/env python3
"""Two medley binaries (or one binary on two models) on the same work, alternated in one run:
prefill tokens/s of one long prompt, decode tokens/s of one sequence, and each run's peak RSS.
For a kernel or engine change, the peer is the binary before it, measured in the same minutes
(the development machine is shared: compare ratios, never figures from different runs).

  python3 bench/engine/ab_medley.py --a /tmp/medley_before --b build/cli/medley \\
      --model ~/.cache/medley/models/SmolLM2-135M-Instruct.Q4_1.gguf --threads 2 --reps 5

  # the same binary on two models (the Q4_1 file against its BF16 dequantization)
  python3 bench/engine/ab_medley.py --a build/cli/medley --b build/cli/medley \\
      --model M.Q4_1.gguf --model-b M.BF16.gguf

Prints per-run figures, then medians and the b/a ratio of the medians, with the load average
before and after. Prompts are the filler text of bench_engine.py (`words`), so a prompt of
--prompt-words words is ~1 token per word on SmolLM2.
"""
import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_engine import words  # noqa: E402


def run_rss(binary, model, threads, prompt, n, extra):
    """One `medley generate --json` in its own process: (timings, its peak RSS in MiB from
    wait4)."""
    cmd = [binary, "generate", "-m", model, "-t", str(threads), "-p", prompt, "-n", str(n),
           "--json", "--ignore-eos"] + extra
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.dup2(w, 1)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
        os.close(r)
        os.execv(cmd[0], cmd)
    os.close(w)
    out = b""
    with os.fdopen(r, "rb") as f:
        out = f.read()
    _, status, ru = os.wait4(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(cmd[:4])} ... failed ({status})")
    line = [ln for ln in out.decode().splitlines() if ln.startswith("{")][-1]
    return json.loads(line), ru.ru_maxrss / 1024


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--a", required=True, help="medley binary A (before)")
    ap.add_argument("--b", required=True, help="medley binary B (after)")
    ap.add_argument("--model", required=True)
    ap.add_argument("--model-b", help="B's model (default: --model)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--prompt-words", type=int, default=512)
    ap.add_argument("--decode", type=int, default=64, help="tokens of the decode case (0: off)")
    args = ap.parse_args()
    model_b = args.model_b or args.model
    long_prompt = words(7, args.prompt_words)
    sides = [("a", args.a, args.model), ("b", args.b, model_b)]
    res = {s: {"prefill": [], "decode": [], "rss": []} for s, _, _ in sides}
    print(f"load average before: {os.getloadavg()}")
    for rep in range(args.reps):
        order = sides if rep % 2 == 0 else sides[::-1]
        for s, binary, model in order:
            t, rss = run_rss(binary, model, args.threads, long_prompt, 1, [])
            res[s]["prefill"].append(t["timings"]["prompt_tokens_per_s"])
            res[s]["rss"].append(rss)
            line = f"rep {rep} {s}: prefill {t['prompt_tokens']} tok {res[s]['prefill'][-1]:.1f} tok/s"
            if args.decode:
                d, _ = run_rss(binary, model, args.threads, "The river", args.decode, [])
                res[s]["decode"].append(d["timings"]["decode_tokens_per_s"])
                line += f", decode {res[s]['decode'][-1]:.1f} tok/s"
            print(line + f", peak RSS {rss:.0f} MiB", flush=True)
    print(f"load average after: {os.getloadavg()}")
    for case in ("prefill", "decode", "rss"):
        if not res["a"][case]:
            continue
        ma, mb = statistics.median(res["a"][case]), statistics.median(res["b"][case])
        unit = "MiB" if case == "rss" else "tok/s"
        print(f"{case:8s} median a {ma:8.1f} {unit}  b {mb:8.1f} {unit}  b/a {mb / ma:.2f}x")


if __name__ == "__main__":
    main()

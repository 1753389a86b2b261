#!/usr/bin/env python3
"""A two-stage pipeline in two processes against one process, same model, same cores, one
run (docs/sharding.md). Cases:

  batched  64 requests of 256 prompt + 128 generated tokens (bench/engine's batch):
           total tokens / wall seconds of
             pipeline: `medley generate --stages cpu:1:0-K,tcp://127.0.0.1:P/cpu:K+1-N`
                       (the head process runs stage 1 on 1 thread, `medley stage --threads
                       1` runs stage 2: two processes, one thread each)
             one:      `medley generate -t 2` (one process, two threads)
           target: pipeline / one >= 0.85 (the micro-batches must overlap the stages)
  decode   single-sequence decode tokens/s (128 tokens) of the same pipeline against the
           same one process: one token per step, nothing to overlap; what a hop costs
  bytes    bytes between the head and its stages per token through the model (hidden
           states, logits, layouts), from the head's report

The split balances the stages' work (--split to change): stage 1 runs layers 0-15 and the
embedding, stage 2 layers 16-29 and the output head (49152 x 576 for SmolLM2, the weight of
about 8 layers, but multiplied only for the rows that need logits: one per sequence in
prefill, every row in decode). Measured on this batch (each stage's busy share of the step
time, printed by `medley generate`): 0-18 | 19-29 left stage 2 idle 39% of the time, 0-15 |
16-29 keeps both ~78% busy.
Each case runs --reps times, pipeline and one alternating; the best of each is kept (the
machine may be shared: the best run is the least disturbed).

  python3 bench/sharding/bench_sharding.py --medley build/cli/medley [--reps 2]
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "engine"))
import bench_engine as be  # noqa: E402  (the same prompts as the engine benchmark)

SUMMARY = re.compile(r"(\d+) prompt \+ (\d+) generated tokens in ([\d.]+) s")
PIPE = re.compile(r"([\d.]+) bytes per token")


def start_stage(medley, model):
    """`medley stage` on a free loopback port, one thread, serving model to heads holding a
    secret made for this run (in $MEDLEY_STAGE_SECRET_FILE, which the heads read too;
    docs/sharding.md "Authentication"); returns (process, port)."""
    fd, path = tempfile.mkstemp(prefix="medley-bench-stage-")
    os.write(fd, os.urandom(24).hex().encode())
    os.close(fd)
    os.environ["MEDLEY_STAGE_SECRET_FILE"] = path
    proc = subprocess.Popen([medley, "stage", "--listen", "127.0.0.1:0", "--device", "cpu",
                             "--threads", "1", "--secret-file", path, "--model", model],
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 30
    while time.time() < deadline:
        line = proc.stderr.readline()
        m = re.search(r"listening on [\d.]+:(\d+)", line)
        if m:
            return proc, int(m.group(1))
        if not line and proc.poll() is not None:
            break
    proc.kill()
    raise SystemExit("medley stage did not report its port")


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:4])} ... failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return p.stdout, p.stderr


def case(args, kind, mode, port, tmp, prompts):
    base = [args.medley, "generate", "-m", args.model]
    if mode == "pipeline":
        n = args.layers
        base += ["-t", "1", "--stages",
                 f"cpu:1:0-{args.split - 1},tcp://127.0.0.1:{port}/cpu:{args.split}-{n - 1}"]
    else:
        base += ["-t", "2"]
    if kind == "decode":
        out, err = run(base + ["-p", prompts["decode"], "-n", str(be.N_DECODE), "--ignore-eos",
                               "--json"])
        return {"tokens_per_s": json.loads(out)["timings"]["decode_tokens_per_s"], "err": err}
    path = os.path.join(tmp, "batch.jsonl")
    with open(path, "w") as f:
        for i, u in enumerate(prompts["users"]):
            f.write(json.dumps({"custom_id": f"r{i}", "prompt": prompts["system"] + u,
                                "max_tokens": be.N_GEN}) + "\n")
    _, err = run(base + ["--batch", path, "--ignore-eos", "--max-seqs", str(be.N_REQ),
                         "-o", os.devnull])
    m = SUMMARY.search(err)
    if not m:
        raise SystemExit(f"batch summary not found:\n{err[-2000:]}")
    total = int(m.group(1)) + int(m.group(2))
    return {"tokens_per_s": total / float(m.group(3)), "err": err}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--medley", default="build/cli/medley")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--split", type=int, default=16, help="first layer of stage 2")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--cases", default="batched,decode")
    args = ap.parse_args()
    prompts = be.make_prompts()
    stage, port = start_stage(args.medley, args.model)
    print(f"# 2-stage pipeline (2 processes x 1 thread, layers 0-{args.split - 1} | "
          f"{args.split}-{args.layers - 1}) vs 1 process x 2 threads, {args.model}, best of "
          f"{args.reps}, {time.strftime('%Y-%m-%d %H:%M')}")
    rows, bytes_tok = [], None
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for kind in args.cases.split(","):
                best = {}
                for _ in range(args.reps):
                    for mode in ("pipeline", "one"):
                        r = case(args, kind, mode, port, tmp, prompts)
                        print(f"  {kind} {mode}: {r['tokens_per_s']:.1f} tok/s", flush=True)
                        if mode == "pipeline" and kind == "batched":
                            m = PIPE.search(r["err"])
                            bytes_tok = float(m.group(1)) if m else None
                        if mode not in best or r["tokens_per_s"] > best[mode]:
                            best[mode] = r["tokens_per_s"]
                rows.append((kind, best["pipeline"], best["one"]))
    finally:
        stage.terminate()
        stage.wait(10)
        os.unlink(os.environ["MEDLEY_STAGE_SECRET_FILE"])
    targets = {"batched": 0.85}
    print(f"{'case':8} {'pipeline tok/s':>15} {'1 process tok/s':>16} {'ratio':>7} {'target':>7}")
    for kind, p, o in rows:
        t = targets.get(kind)
        print(f"{kind:8} {p:15.1f} {o:16.1f} {p / o:6.2f}x "
              f"{(f'{t:.2f}x' if t else '-'):>7}")
    if bytes_tok is not None:
        print(f"bytes between head and stages per token (batched): {bytes_tok:.0f}")


if __name__ == "__main__":
    main()

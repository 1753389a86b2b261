#!/usr/bin/env python3
"""bulk.py — a bulk /v1/embeddings batch through the fleet (docs/embeddings.md, "Bulk runs"):
N lines generated at run time, answered (a) by `medley run` (private Redis, one worker in the
process) and (b) by `medley submit` into one redis-server and W `medley worker` processes
started and warm (model loaded, heartbeat written) before the clock starts. Each run is
checked exactly-once (every custom_id answered once, no other), every answer a 200 with one
vector of the model's dimension and unit length, usage counted; lines/s and tokens/s are
printed for both, with the ratio fleet / run.

    python3 bench/embeddings/bulk.py --medley build/cli/medley --model all-minilm-l6-v2 \\
        --lines 100000 [--workers 2] [--threads 2] [--min-tokens 8 --max-tokens 64]

    --model NAME         a registered embedding model; its texts are whole words of its own
                         WordPiece vocabulary (bench/embeddings/make_texts.py), lengths spread
                         evenly over --min-tokens..--max-tokens (special tokens included)
    --synthetic          instead, a random BERT (tests/integration/embed_reference.py) of
                         --synthetic-shape C,H,L,F,V written as a sentence-transformers
                         directory and registered in a temporary MEDLEY_MODELS; the lines are
                         token ids (ctest `embed_bulk` runs this, small and quick)
    --threads T          CPU threads of `medley run`'s worker; each of the W workers gets
                         T / W (at least 1), so both runs use the same cores
    --inputs-per-line K  inputs in each line (default 1: one text a line, the common case)

Exit status 1 when any check fails. CPU seconds (user + system of the processes the script
waited for) are printed beside the wall times: on a shared box they are the steadier figure.
The timings: (a) from `medley run`'s start to its exit
(model load included: a few hundred ms for MiniLM), (b) from `medley submit`'s start until
the batch's status is completed (workers already warm; `medley results` excluded)."""
import argparse
import json
import math
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "integration"))


def text_inputs(model_dir, n, lo, hi, seed):
    """n texts of lo..hi tokens ([CLS] and [SEP] counted): whole vocabulary words, one token
    each (make_texts.words_of)."""
    from make_texts import words_of
    rng = random.Random(seed)
    words = words_of(model_dir)
    out = []
    for i in range(n):
        k = max(1, lo + (i * 7919) % (hi - lo + 1) - 2)
        out.append(" ".join(rng.choice(words) for _ in range(k)))
    return out


def id_inputs(vocab, n, lo, hi, seed):
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(lo + (i * 7919) % (hi - lo + 1))]
            for i in range(n)]


def write_lines(path, model, inputs, per_line):
    with open(path, "w") as f:
        for i in range(0, len(inputs), per_line):
            chunk = inputs[i:i + per_line]
            body = {"model": model, "input": chunk[0] if per_line == 1 else chunk}
            f.write(json.dumps({"custom_id": "e%07d" % (i // per_line), "method": "POST",
                                "url": "/v1/embeddings", "body": body}) + "\n")
    return (len(inputs) + per_line - 1) // per_line


def check_answers(path, n_lines, per_line, dim, what):
    """Exactly once, every answer a 200 with per_line unit vectors of dim; returns the tokens."""
    seen, bad, tokens, by_worker = {}, [], 0, {}
    with open(path) as f:
        for raw in f:
            a = json.loads(raw)
            cid = a.get("custom_id")
            seen[cid] = seen.get(cid, 0) + 1
            r = a.get("response") or {}
            body = r.get("body") or {}
            data = body.get("data") or []
            ok = r.get("status_code") == 200 and len(data) == per_line and all(
                len(d["embedding"]) == dim for d in data)
            if ok:
                v = data[0]["embedding"]
                ok = abs(math.sqrt(sum(x * x for x in v)) - 1) < 1e-4
            if not ok and len(bad) < 3:
                bad.append(raw[:300])
            tokens += (body.get("usage") or {}).get("total_tokens", 0)
            wk = (a.get("medley") or {}).get("worker")
            by_worker[wk] = by_worker.get(wk, 0) + 1
    want = {"e%07d" % i for i in range(n_lines)}
    doubled = [k for k, c in seen.items() if c > 1]
    missing = want - set(seen)
    extra = set(seen) - want
    fails = []
    if doubled or missing or extra:
        fails.append("%s: exactly-once violated: %d doubled %s, %d missing %s, %d unexpected %s" % (
            what, len(doubled), doubled[:3], len(missing), sorted(missing)[:3], len(extra),
            sorted(extra)[:3]))
    if bad:
        fails.append("%s: %s" % (what, "answers not 200 with unit vectors of %d: %s" % (dim, bad)))
    return tokens, fails, by_worker


class Redis:
    """A private redis-server on a unix socket in tmp (no port another process can take)."""

    def __init__(self, tmp):
        import redis
        self.sock = os.path.join(tmp, "redis.sock")
        self.proc = subprocess.Popen(["redis-server", "--port", "0", "--unixsocket", self.sock,
                                      "--save", "", "--appendonly", "no", "--dir", tmp],
                                     stdout=subprocess.DEVNULL)
        self.url = "unix://" + self.sock
        self.r = redis.Redis(unix_socket_path=self.sock, decode_responses=True)
        for _ in range(200):
            if self.proc.poll() is not None:
                break
            try:
                self.r.ping()
                return
            except Exception:
                time.sleep(0.05)
        raise SystemExit("redis-server did not start (exit %s)" % self.proc.poll())

    def stop(self):
        self.proc.terminate()
        self.proc.wait()


def children_cpu():
    """CPU seconds (user + system) of the children waited for so far."""
    u = resource.getrusage(resource.RUSAGE_CHILDREN)
    return u.ru_utime + u.ru_stime


def run_local(a, src, tmp, env):
    out = os.path.join(tmp, "run.out.jsonl")
    t0 = time.time()
    c0 = children_cpu()
    p = subprocess.run([a.medley, "run", "-m", a.name, src, "-o", out, "--quiet", "--threads",
                        str(a.threads)], capture_output=True, text=True, env=env)
    dt = time.time() - t0
    if p.returncode != 0:
        raise SystemExit("medley run exited %d: %s" % (p.returncode, p.stderr[-2000:]))
    return out, dt, children_cpu() - c0


def run_fleet(a, src, tmp, env):
    """(output path, seconds, status, CPU seconds of the workers and submit: model loads
    included, redis-server not)."""
    c0 = children_cpu()
    srv = Redis(tmp)
    workers, logs = [], []
    per = max(1, a.threads // a.workers)
    try:
        for i in range(a.workers):
            log = open(os.path.join(tmp, "worker%d.log" % i), "w")
            logs.append(log)
            workers.append(subprocess.Popen(
                [a.medley, "worker", "--redis", srv.url, "--model", a.name, "--threads", str(per),
                 "--id", "bulk-w%d" % i], stdout=log, stderr=subprocess.STDOUT, env=env))
        deadline = time.time() + 120
        while len(srv.r.keys("medley:worker:{*}")) < a.workers:  # loaded: heartbeats written
            if time.time() > deadline or any(w.poll() is not None for w in workers):
                raise SystemExit("workers did not start: " + open(logs[0].name).read()[-2000:])
            time.sleep(0.1)
        t0 = time.time()
        p = subprocess.run([a.medley, "submit", src, "--redis", srv.url, "--model", a.name],
                           capture_output=True, text=True, env=env)
        if p.returncode != 0:
            raise SystemExit("medley submit exited %d: %s" % (p.returncode, p.stderr[-2000:]))
        batch = p.stdout.strip()
        meta = {}
        while meta.get("status") not in ("completed", "failed", "cancelled", "expired"):
            time.sleep(0.05)
            meta = srv.r.hgetall("medley:{%s}:meta" % batch)
            if any(w.poll() is not None for w in workers):
                raise SystemExit("a worker exited during the run: " +
                                 open(logs[0].name).read()[-2000:])
        dt = time.time() - t0
        out = os.path.join(tmp, "fleet.out.jsonl")
        p = subprocess.run([a.medley, "results", batch, "--redis", srv.url, "-o", out],
                           capture_output=True, text=True, env=env)
        if p.returncode != 0:
            raise SystemExit("medley results exited %d: %s" % (p.returncode, p.stderr[-2000:]))
        status = meta.get("status")
    finally:
        for w in workers:
            w.terminate()
        for w in workers:
            w.wait()
        for log in logs:
            log.close()
        c1 = children_cpu()
        srv.stop()
    return out, dt, status, c1 - c0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--medley", default="build/cli/medley")
    ap.add_argument("--model", default="all-minilm-l6-v2")
    ap.add_argument("--synthetic", action="store_true")
    ap.add_argument("--synthetic-shape", default="384,12,6,1536,30522")
    ap.add_argument("--lines", type=int, default=100000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--min-tokens", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--inputs-per-line", type=int, default=1)
    ap.add_argument("--seed", type=int, default=40)
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    a = ap.parse_args()
    a.medley = os.path.abspath(a.medley)
    tmp = tempfile.mkdtemp(prefix="medley-bulk-")
    env = dict(os.environ)
    n_in = a.lines * a.inputs_per_line
    t_gen = time.time()
    if a.synthetic:
        import numpy as np
        os.environ.setdefault("MEDLEY_BIN", a.medley)  # embed_reference reads it at import
        import embed_reference as ref
        C, H, L, F, V = map(int, a.synthetic_shape.split(","))
        cfg, t = ref.random_bert(np.random.default_rng(a.seed), C=C, H=H, L=L, F=F, V=V,
                                 P=max(64, a.max_tokens))
        d = os.path.join(tmp, "bert")
        ref.write_st(d, cfg, t, "mean", True)
        env["MEDLEY_MODELS"] = os.path.join(tmp, "models")
        a.name = "bulk-bert"
        p = subprocess.run([a.medley, "models", "add", a.name, d], capture_output=True,
                           text=True, env=env)
        if p.returncode != 0:
            raise SystemExit("medley models add: " + p.stderr)
        dim, inputs = C, id_inputs(V, n_in, a.min_tokens, a.max_tokens, a.seed)
    else:
        a.name = a.model
        p = subprocess.run([a.medley, "models", "path", a.name], capture_output=True, text=True)
        if p.returncode != 0:
            raise SystemExit("medley models path %s: %s (fetch it: medley models fetch %s)" % (
                a.name, p.stderr.strip(), a.name))
        d = p.stdout.strip()
        dim = json.load(open(os.path.join(d, "config.json")))["hidden_size"]
        inputs = text_inputs(d, n_in, a.min_tokens, a.max_tokens, a.seed)
    src = os.path.join(tmp, "in.jsonl")
    n_lines = write_lines(src, a.name, inputs, a.inputs_per_line)
    print("%d lines (%d inputs of %d..%d tokens) of %s written in %.1f s; load %s" % (
        n_lines, n_in, a.min_tokens, a.max_tokens, a.name, time.time() - t_gen,
        os.getloadavg()), flush=True)
    fails = []
    out, dt_run, cpu_run = run_local(a, src, tmp, env)
    tok_run, f, _ = check_answers(out, n_lines, a.inputs_per_line, dim, "medley run")
    fails += f
    print("medley run: %d lines in %.1f s: %.1f lines/s, %.0f tokens/s; %.1f CPU s (redis "
          "included), %.0f lines per CPU s; load %s" % (
              n_lines, dt_run, n_lines / dt_run, tok_run / dt_run, cpu_run, n_lines / cpu_run,
              os.getloadavg()), flush=True)
    out, dt_fleet, status, cpu_fleet = run_fleet(a, src, tmp, env)
    tok_fleet, f, per_worker = check_answers(out, n_lines, a.inputs_per_line, dim, "submit + workers")
    fails += f
    if status != "completed":
        fails.append("the fleet's batch ended %s" % status)
    if tok_fleet != tok_run:
        fails.append("usage differs: %d tokens (run) and %d (fleet)" % (tok_run, tok_fleet))
    print("submit + %d workers (%d thread(s) each): %d lines in %.1f s: %.1f lines/s, %.0f "
          "tokens/s; %.1f CPU s (workers and submit, redis not), %.0f lines per CPU s; lines "
          "answered per worker %s; load %s" % (
              a.workers, max(1, a.threads // a.workers), n_lines, dt_fleet, n_lines / dt_fleet,
              tok_fleet / dt_fleet, cpu_fleet, n_lines / cpu_fleet, per_worker,
              os.getloadavg()), flush=True)
    print("exactly once: %s (%d custom_ids each run); fleet / run: %.2fx" % (
        "yes" if not fails else "NO", n_lines, dt_run / dt_fleet))
    for x in fails:
        print("FAIL: " + x)
    if a.keep:
        print("kept " + tmp)
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())

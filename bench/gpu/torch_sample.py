#!/usr/bin/env python3
"""The peer for bench/gpu/bench_sample.c: choosing the next token for a batch of logit rows in
PyTorch, as transformers' logits processors and vLLM's sampler do it, on the same shapes, the
same GPU, in the same run:

- greedy: torch.argmax;
- sampled: temperature 0.8, top_k 50 (topk threshold, masked to -inf), top_p 0.9 (sort,
  softmax, cumsum, mask, scatter back), softmax, torch.multinomial;
- penalised: the same after the repetition penalty (gather / where / scatter over the row's
  512 distinct tokens, transformers' RepetitionPenaltyLogitsProcessor) and presence and
  frequency penalties from output-token bin counts (scatter_add, vLLM's apply_penalties),
  with the raw log_softmax's logprob of the chosen token and its 5 most likely tokens.

    python3 bench/gpu/torch_sample.py [--rows 1,256] [--vocab 128256] [--out sample-torch.json]
    python3 bench/gpu/torch_sample.py --compare medley-sample.json sample-torch.json

Each figure is the best of 5 rounds of 10 calls after a warm-up, microseconds per call.
Prints one JSON object; --compare prints one line per batch with PyTorch's time over
medley's for each case.
"""
import argparse
import json
import sys
import time

from torch_gpu import DEVICE, device_name, emit, sync, torch_or_skip

N_PEN, N_TOP = 512, 5
CASES = ("greedy", "sampled", "penalised")


def compare(a_path, b_path):
    try:
        a, b = json.load(open(a_path)), json.load(open(b_path))
    except Exception as ex:
        print("sampling vs torch: no figures (%s)" % ex)
        return 0
    peer = {r["rows"]: r for r in b["results"]}
    for r in a["results"]:
        p = peer.get(r["rows"])
        if not p:
            continue
        print("sampling %d rows x %d: " % (r["rows"], a["vocab"]) + "; ".join(
            "%s medley %.1f us, torch %.1f us, torch/medley %.2fx" % (
                c, r[c + "_us"], p[c + "_us"], p[c + "_us"] / r[c + "_us"]) for c in CASES))
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,256")
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--out")
    ap.add_argument("--compare", nargs=2, metavar=("MEDLEY_JSON", "TORCH_JSON"))
    a = ap.parse_args()
    if a.compare:
        return compare(*a.compare)
    got = torch_or_skip()
    if not got:
        return 77
    torch, _ = got
    V = a.vocab
    res = {"bench": "torch_sample", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "device": device_name(torch), "torch": torch.__version__, "vocab": V,
           "penalty_entries": N_PEN, "top_logprobs": N_TOP, "results": []}
    g = torch.Generator(device=DEVICE).manual_seed(0)
    for B in [int(x) for x in a.rows.split(",")]:
        logits = torch.rand(B, V, device=DEVICE, generator=g) * 24 - 12
        j = torch.arange(N_PEN, device=DEVICE)
        rows = torch.arange(B, device=DEVICE).unsqueeze(1)
        ids = (j.unsqueeze(0) * 2477 + rows * 131) % V  # the same distinct tokens as medley's
        reps = (j % 3).tolist()  # output counts 0, 1, 2, ... as medley's entries
        out_ids = torch.cat([ids[:, k:k + 1].expand(B, n) for k, n in enumerate(reps) if n],
                            dim=1)

        def warp_and_draw(x):
            x = x / 0.8
            kth = torch.topk(x, 50, dim=-1).values[:, -1:]
            x = x.masked_fill(x < kth, float("-inf"))
            sx, si = torch.sort(x, descending=False, dim=-1)
            cum = sx.softmax(dim=-1).cumsum(dim=-1)
            remove = cum <= (1 - 0.9)
            remove[:, -1] = False
            x = x.masked_fill(remove.scatter(1, si, remove), float("-inf"))
            return torch.multinomial(x.softmax(dim=-1), 1, generator=g).squeeze(1)

        def greedy():
            return torch.argmax(logits, dim=-1)

        def sampled():
            return warp_and_draw(logits)

        def penalised():
            raw_lsm = torch.log_softmax(logits, dim=-1)
            x = logits.clone()
            score = torch.gather(x, 1, ids)
            score = torch.where(score < 0, score * 1.1, score / 1.1)
            x.scatter_(1, ids, score)
            counts = torch.zeros(B, V, device=DEVICE, dtype=x.dtype)
            counts.scatter_add_(1, out_ids, torch.ones_like(out_ids, dtype=x.dtype))
            x -= 0.3 * counts + 0.3 * (counts > 0).to(x.dtype)
            tok = warp_and_draw(x)
            lp = torch.gather(raw_lsm, 1, tok.unsqueeze(1))
            top = torch.topk(raw_lsm, N_TOP, dim=-1)
            return tok, lp, top

        r = {"rows": B}
        for name, fn in zip(CASES, (greedy, sampled, penalised)):
            fn()
            sync(torch)
            best = 1e30
            for _ in range(5):
                t = time.perf_counter()
                for _ in range(10):
                    fn()
                sync(torch)
                best = min(best, (time.perf_counter() - t) / 10)
            r[name + "_us"] = best * 1e6
            print(f"torch sample {B} rows x {V}, {name}: {best * 1e6:.1f} us", file=sys.stderr)
        res["results"].append(r)
        del logits
    return emit(res, a.out)


if __name__ == "__main__":
    sys.exit(main())

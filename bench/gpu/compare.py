#!/usr/bin/env python3
"""Print the issue's figures from medley_gpu_bench's and hf_generate.py's JSON results:
batch-1 HBM bandwidth fraction (target >= 0.70 of 4.8 TB/s) and batch-N tokens/s against
PyTorch + transformers `generate` (target >= 3x). Missing inputs are reported, not faked.

    python3 bench/gpu/compare.py bench-medley.json bench-hf.json
"""
import json
import sys


def load(p):
    try:
        return json.load(open(p))
    except (OSError, ValueError) as e:
        print(f"- {p}: not available ({e})")
        return None


def main():
    m, h = load(sys.argv[1]), load(sys.argv[2])
    if m:
        b1, bn = m["batch1"], m["batchN"]
        ok = "meets" if b1["hbm_fraction"] >= 0.70 else "MISSES"
        print(f"- batch 1 decode ({m['model']}): {b1['ms_per_token']:.3f} ms/token "
              f"({b1['ms_per_token_no_graph']:.3f} without CUDA graph), "
              f"{b1['weight_gbps']:.0f} GB/s of weights = {100 * b1['hbm_fraction']:.1f}% of "
              f"{b1['hbm_tbps_assumed']} TB/s: {ok} the 70% target")
        print(f"- batch {bn['batch']}: medley {bn['tokens_per_s']:.0f} generated tokens/s "
              f"(prefill {bn['prefill_s']:.2f} s + decode {bn['decode_s']:.2f} s, "
              f"{bn['decode_step_ms']:.2f} ms/step)")
    if h:
        print(f"- batch {h['batchN']['batch']}: PyTorch {h['torch']} + transformers "
              f"{h['transformers']} generate ({h['attention']}): "
              f"{h['batchN']['tokens_per_s']:.0f} tokens/s; batch 1 "
              f"{h['batch1']['ms_per_token']:.3f} ms/token")
    if m and h:
        r = m["batchN"]["tokens_per_s"] / h["batchN"]["tokens_per_s"]
        r1 = h["batch1"]["ms_per_token"] / m["batch1"]["ms_per_token"]
        ok = "meets" if r >= 3 else "MISSES"
        print(f"- ratio medley / transformers: {r:.2f}x at batch {m['batchN']['batch']} "
              f"({ok} the 3x target), {r1:.2f}x at batch 1")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""The peer for bench/gpu/bench_attn.c: PyTorch's scaled_dot_product_attention on the same
prefill shapes (one sequence of L tokens attending causally to itself; 32 query heads over 8
kv heads, head_dim 128, f16), on the same GPU in the same run. K and V are contiguous here
(medley reads a paged cache); PyTorch picks its fastest backend (FlashAttention-2 on an
H100/H200).

    python3 bench/gpu/torch_sdpa.py [--lens 512,2048,8192] [--decode 256:512,256:2048,1:32768]
                                    [--out sdpa.json]
    python3 bench/gpu/torch_sdpa.py --compare attn.json sdpa.json

Prefill: FLOPs as medley_attn_bench counts them, 4 * head_dim * heads * L (L + 1) / 2; best
of 5 timed calls after a warm-up. Decode: B sequences of one query over L keys each (q
[B, 32, 1, 128], K/V [B, 8, L, 128], f16, not causal), bytes of K and V per second; best of
5 rounds of 20 calls. Prints one JSON object; --compare prints one line per shape with
PyTorch's time over medley's.
"""
import argparse
import json
import sys
import time

from torch_gpu import DEVICE, device_name, emit, sync, torch_or_skip

NH, NKV, HD = 32, 8, 128


def compare(a_path, b_path):
    try:
        a, b = json.load(open(a_path)), json.load(open(b_path))
    except Exception as ex:
        print("attention prefill vs torch sdpa: no figures (%s)" % ex)
        return 0
    dpeer = {(r["batch"], r["len"]): r for r in b.get("decode", [])}
    for r in a.get("decode", []):
        p = dpeer.get((r["batch"], r["len"]))
        if not p:
            continue
        print("attention decode %d x %d keys: medley %.1f us (%.0f GB/s of K/V, %d splits), "
              "torch sdpa %.1f us (%.0f GB/s): torch/medley %.2fx" % (
                  r["batch"], r["len"], r["us"], r["kv_gbps"], r["splits"], p["us"],
                  p["kv_gbps"], p["us"] / r["us"]))
    peer = {r["len"]: r for r in b["results"]}
    for r in a["results"]:
        p = peer.get(r["len"])
        if not p:
            continue
        print("attention prefill L=%d: medley tensor cores %.3f ms (%.1f TFLOP/s), f32 %.3f ms, "
              "torch sdpa (%s) %.3f ms (%.1f TFLOP/s): torch/medley %.2fx" % (
                  r["len"], r["tc_ms"], r["tc_tflops"], r["f32_ms"], b.get("backend", "?"),
                  p["ms"], p["tflops"], p["ms"] / r["tc_ms"]))
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lens", default="512,2048,8192")
    ap.add_argument("--decode", default="256:512,256:2048,1:32768")
    ap.add_argument("--out")
    ap.add_argument("--compare", nargs=2, metavar=("ATTN_JSON", "SDPA_JSON"))
    a = ap.parse_args()
    if a.compare:
        return compare(*a.compare)
    got = torch_or_skip("torch.nn.functional")
    if not got:
        return 77
    torch, (F,) = got
    res = {"bench": "torch_sdpa", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "device": device_name(torch), "torch": torch.__version__,
           "heads": NH, "kv_heads": NKV, "head_dim": HD, "results": []}
    g = torch.Generator(device=DEVICE).manual_seed(0)
    for L in [int(x) for x in a.lens.split(",")]:
        q = torch.rand(1, NH, L, HD, device=DEVICE, dtype=torch.float16, generator=g) * 2 - 1
        k = torch.rand(1, NKV, L, HD, device=DEVICE, dtype=torch.float16, generator=g) * 4 - 2
        v = torch.rand(1, NKV, L, HD, device=DEVICE, dtype=torch.float16, generator=g) * 2 - 1
        try:
            def run():
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            run()
            res["backend"] = "gqa"
        except TypeError:  # torch < 2.5: no enable_gqa; repeat the kv heads
            k = k.repeat_interleave(NH // NKV, dim=1)
            v = v.repeat_interleave(NH // NKV, dim=1)

            def run():
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)
            res["backend"] = "repeated kv"
        run()
        sync(torch)
        best = 1e30
        for _ in range(5):
            t = time.perf_counter()
            run()
            sync(torch)
            best = min(best, time.perf_counter() - t)
        flops = 4.0 * HD * NH * L * (L + 1) / 2
        res["results"].append({"len": L, "ms": best * 1e3, "tflops": flops / best / 1e12})
        print(f"torch sdpa L={L}: {best * 1e3:.3f} ms, {flops / best / 1e12:.1f} TFLOP/s",
              file=sys.stderr)
    res["decode"] = []
    for bl in a.decode.split(","):
        B, L = (int(x) for x in bl.split(":"))
        q = torch.rand(B, NH, 1, HD, device=DEVICE, dtype=torch.float16, generator=g) * 2 - 1
        k = torch.rand(B, NKV, L, HD, device=DEVICE, dtype=torch.float16, generator=g) * 4 - 2
        v = torch.rand(B, NKV, L, HD, device=DEVICE, dtype=torch.float16, generator=g) * 2 - 1
        if res.get("backend") == "repeated kv":
            k = k.repeat_interleave(NH // NKV, dim=1)
            v = v.repeat_interleave(NH // NKV, dim=1)

            def dec():
                return F.scaled_dot_product_attention(q, k, v)
        else:
            def dec():
                return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        dec()
        sync(torch)
        best = 1e30
        for _ in range(5):
            t = time.perf_counter()
            for _ in range(20):
                dec()
            sync(torch)
            best = min(best, (time.perf_counter() - t) / 20)
        nbytes = 2.0 * B * L * NKV * HD * 2  # K and V as medley reads them (not repeated)
        res["decode"].append({"batch": B, "len": L, "us": best * 1e6,
                              "kv_gbps": nbytes / best / 1e9})
        print(f"torch sdpa decode {B} x {L}: {best * 1e6:.1f} us, {nbytes / best / 1e9:.0f} GB/s",
              file=sys.stderr)
        del q, k, v
    return emit(res, a.out)


if __name__ == "__main__":
    sys.exit(main())

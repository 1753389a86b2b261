#!/usr/bin/env python3
"""The device's two ceilings, measured on the device in the run rather than taken from its
datasheet, read through PyTorch so that they do not depend on medley's own code:

- copy: a device-to-device copy of --copy-gb gigabytes (random bf16), counting bytes read
  plus bytes written, the practical HBM bandwidth a memory-bound kernel can approach;
- matmul: an N x N x N bf16 matrix product on random data (torch.matmul, cuBLAS), in TFLOP/s.

Each is the median of --reps timed runs (CUDA events) after three warm-ups. compare.py
--ceilings prints medley's batch-1 bandwidth against the copy figure beside the 4.8 TB/s of
the datasheet.

    python3 bench/gpu/torch_ceilings.py [--copy-gb 4] [--n 8192] [--reps 10] [--out FILE]
"""
import argparse
import sys

from torch_gpu import DEVICE, device_name, emit, timed_ms, torch_or_skip


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--copy-gb", type=float, default=4.0)
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--out")
    a = ap.parse_args()
    got = torch_or_skip()
    if got is None:
        return 77
    torch, _ = got
    n_el = int(a.copy_gb * 1e9) // 2
    src = torch.randn(n_el, device=DEVICE, dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    med, lo, hi = timed_ms(torch, lambda: dst.copy_(src), a.reps)
    if not torch.equal(dst[:1 << 20], src[:1 << 20]):
        print("copy check failed: the destination differs from the source")
        return 1
    nbytes = 2 * src.numel() * src.element_size()
    copy = {"bytes_moved": nbytes, "ms_median": med, "ms_min": lo, "ms_max": hi,
            "gbps_read_plus_write": nbytes / (med / 1e3) / 1e9}
    del src, dst
    x = torch.randn(a.n, a.n, device=DEVICE, dtype=torch.bfloat16)
    w = torch.randn(a.n, a.n, device=DEVICE, dtype=torch.bfloat16)
    med, lo, hi = timed_ms(torch, lambda: torch.matmul(x, w), a.reps)
    flops = 2.0 * a.n ** 3
    mm = {"n": a.n, "ms_median": med, "ms_min": lo, "ms_max": hi,
          "tflops": flops / (med / 1e3) / 1e12}
    res = {"device": device_name(torch), "torch": torch.__version__,
           "copy": copy, "matmul_bf16": mm}
    print(f"ceilings on {res['device']}: device-to-device copy "
          f"{copy['gbps_read_plus_write']:.0f} GB/s (read + write, {a.copy_gb:g} GB, median of "
          f"{a.reps}); bf16 {a.n}^3 matmul {mm['tflops']:.0f} TFLOP/s", file=sys.stderr)
    return emit(res, a.out)


if __name__ == "__main__":
    sys.exit(main())

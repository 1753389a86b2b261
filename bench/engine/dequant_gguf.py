#!/usr/bin/env python3
"""Write a GGUF whose quantized tensors are the input's dequantized to BF16 (F32 tensors kept,
metadata copied), so that one engine can be measured on the same weights quantized and in
BF16 (the issue-41 bar: quantized prefill at least as fast as BF16 prefill).

  python3 bench/engine/dequant_gguf.py IN.gguf OUT.gguf

Needs the `gguf` Python package (scripts/setup.sh installs it) and numpy.
"""
import sys

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader, GGUFValueType, GGUFWriter
from gguf.quants import dequantize


def main():
    src, dst = sys.argv[1], sys.argv[2]
    r = GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    w = GGUFWriter(dst, arch)
    for f in r.fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.architecture":
            continue
        sub = f.types[1] if f.types[0] == GGUFValueType.ARRAY and len(f.types) > 1 else None
        w.add_key_value(f.name, f.contents(), f.types[0], sub)
    for t in r.tensors:
        shape = [int(x) for x in reversed(t.shape)]  # numpy order: rows first
        if t.tensor_type in (Q.F32, Q.F16, Q.BF16):
            w.add_tensor(t.name, np.asarray(t.data).reshape(shape), raw_dtype=t.tensor_type)
            continue
        f32 = dequantize(t.data, t.tensor_type).astype(np.float32).reshape(shape)
        bf16 = (f32.view(np.uint32) + 0x7FFF + ((f32.view(np.uint32) >> 16) & 1)) >> 16
        w.add_tensor(t.name, bf16.astype(np.uint16), raw_dtype=Q.BF16)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()

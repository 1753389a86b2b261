"""Copy a kernels/cuda .cu file without its host launchers (top-level blocks that contain a
<<<...>>> launch), so the kernels compile as host C++ against fake/cuda_runtime.h.

    strip.py FILE.cu [OUT.cc]   (stdout without OUT)"""
import re, sys
src = open(sys.argv[1]).read()
out, i, n = [], 0, len(src)
# split into top-level chunks ending at a top-level '}' or ';'
depth, start = 0, 0
chunks = []
j = 0
while j < n:
    c = src[j]
    if src.startswith('//', j):
        j = src.find('\n', j); continue
    if src.startswith('/*', j):
        j = src.find('*/', j) + 2; continue
    if c == '"':
        j += 1
        while src[j] != '"':
            j += 2 if src[j] == '\\' else 1
        j += 1; continue
    if c == "'":
        j += 1
        while src[j] != "'":
            j += 2 if src[j] == '\\' else 1
        j += 1; continue
    if c == '#' and depth == 0 and (j == 0 or src[j-1] == '\n'):
        e = j
        while True:
            e = src.find('\n', e)
            if src[e-1] != '\\': break
            e += 1
        chunks.append(src[start:e+1]); start = e + 1; j = e + 1; continue
    if c == '{': depth += 1
    elif c == '}':
        depth -= 1
        if depth == 0:
            k = j + 1
            if src[k:k+1] == ';': k += 1
            chunks.append(src[start:k]); start = k; j = k; continue
    elif c == ';' and depth == 0:
        chunks.append(src[start:j+1]); start = j + 1
    j += 1
chunks.append(src[start:])
for ch in chunks:
    if any(s in ch for s in ("<<<", "CUDA_GUARD", "cublasGemmEx")):
        continue
    out.append(ch)
text = ''.join(out)
if len(sys.argv) > 2:
    with open(sys.argv[2], 'w') as f:
        f.write(text)
else:
    sys.stdout.write(text)

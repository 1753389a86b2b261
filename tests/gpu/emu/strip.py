"""Turn a kernels/cuda .cu file into host C++ for fake/cuda_runtime.h, in one of two ways:

    strip.py FILE.cu [OUT.cc]              without its host launchers (top-level blocks that
                                           contain a <<<...>>> launch, CUDA_GUARD or cuBLAS)
    strip.py --launchers FILE.cu [OUT.cc]  everything kept; each launch NAME<<<cfg>>>(args)
                                           becomes emu_launch_k(emu_cfg(cfg), "NAME", NAME, args), a
                                           launch on the emulated runtime (emu_rt.cc); in a
                                           macro whose parameter NAME is, #NAME (the name the
                                           macro is given, for the launch log)

(stdout without OUT)"""
import sys
args = sys.argv[1:]
launchers = bool(args) and args[0] == '--launchers'
if launchers:
    args = args[1:]
src = open(args[0]).read()


def match_paren(s, i):
    """Index just past the ')' matching the '(' at s[i]."""
    depth = 0
    for j in range(i, len(s)):
        if s[j] == '(':
            depth += 1
        elif s[j] == ')':
            depth -= 1
            if depth == 0:
                return j + 1
    raise SystemExit('strip.py: unbalanced parentheses after offset %d' % i)


def macro_params(s, i):
    """The parameter names of the #define whose (continued) line holds offset i, or []."""
    start = s.rfind('\n', 0, i) + 1
    while start > 1 and s[start - 2] == '\\':
        start = s.rfind('\n', 0, start - 1) + 1
    line = s[start:i].lstrip()
    if not line.startswith('#define'):
        return []
    open_ = line.find('(')
    close = line.find(')', open_)
    if open_ < 0 or close < 0 or ' ' in line[len('#define '):open_].strip():
        return []
    return [p.strip() for p in line[open_ + 1:close].split(',')]


def rewrite_launches(s):
    out, pos = [], 0
    while True:
        p = s.find('<<<', pos)
        if p < 0:
            out.append(s[pos:])
            return ''.join(out)
        # the kernel's name: an identifier, maybe followed by <template arguments>
        b = p
        while s[b - 1] in ' \t':
            b -= 1
        if s[b - 1] == '>':
            depth = 0
            while True:
                b -= 1
                if s[b] == '>':
                    depth += 1
                elif s[b] == '<':
                    depth -= 1
                    if depth == 0:
                        break
        while s[b - 1].isalnum() or s[b - 1] in '_:':
            b -= 1
        name = s[b:p].strip()
        q = s.find('>>>', p)
        cfg = s[p + 3:q]
        a = q + 3
        while s[a] in ' \t\\\n':
            a += 1
        if s[a] != '(':
            raise SystemExit('strip.py: no argument list after the launch of %s' % name)
        e = match_paren(s, a)
        inner = s[a + 1:e - 1].strip()
        out.append(s[pos:b])
        label = '"%s"' % name.replace('"', '')
        if name in macro_params(s, b):  # GEMV_LAUNCH(kernel, ...): the name it is given
            label = '#' + name
        out.append('emu_launch_k(emu_cfg(%s), %s, %s%s%s)' % (cfg, label, name,
                                                           ', ' if inner else '', inner))
        pos = e


if launchers:
    text = rewrite_launches(src)
    if len(args) > 1:
        with open(args[1], 'w') as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    sys.exit(0)
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
if len(args) > 1:
    with open(args[1], 'w') as f:
        f.write(text)
else:
    sys.stdout.write(text)

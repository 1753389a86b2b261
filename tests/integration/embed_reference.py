#!/usr/bin/env python3
"""Encoder forward pass against a numpy (float64) reference (docs/embeddings.md, "Tests").

Builds small random BERTs with numpy, writes each as a sentence-transformers directory
(config.json, model.safetensors written by hand, modules.json, 1_Pooling, 2_Normalize,
sentence_bert_config.json), and compares `medley embed --ids` with the reference on inputs of
1 to 40 tokens, packed many to a step: cosine >= 0.9999 on every input, for each pooling
mode (mean, cls, max, mean-sqrt-len, last-token) with and without Normalize, and the same
model written as a GGUF `bert` file (the gguf package, llama.cpp's names); a decoder used as
an embedder (tiny Qwen2, last-token pooling) against the fixture logits. Then hostile
checkpoints (a truncated safetensors file, a shape-mismatched tensor, an unknown activation)
must be refused with a sentence naming the problem. Seconds; needs numpy and the medley
binary (MEDLEY_BIN). MEDLEY_EMBED_MODEL=DIR also checks a real sentence-transformers
directory (all-MiniLM-L6-v2) against the same reference (bench/embeddings runs it).
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np

MEDLEY = os.environ["MEDLEY_BIN"]
SOURCE_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
failures = []


def check(ok, what, out=""):
    print("%s: %s" % ("ok" if ok else "FAIL", what))
    if not ok:
        failures.append(what)
        print(out[-2000:])


def write_safetensors(path, tensors):
    header, off, blobs = {}, 0, []
    for name, a in tensors.items():
        dt = {np.float32: "F32", np.int64: "I64"}[a.dtype.type]
        b = a.tobytes()
        header[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def random_bert(rng, C=64, H=4, L=2, F=128, V=500, P=64):
    def w(*s):
        return (rng.standard_normal(s) * 0.08).astype(np.float32)

    def ln():
        return (1 + w(C)).astype(np.float32), w(C)

    t = {"embeddings.position_ids": np.arange(P, dtype=np.int64)[None, :]}
    t["embeddings.word_embeddings.weight"] = w(V, C) * 10
    t["embeddings.position_embeddings.weight"] = w(P, C) * 5
    t["embeddings.token_type_embeddings.weight"] = w(2, C) * 5
    t["embeddings.LayerNorm.weight"], t["embeddings.LayerNorm.bias"] = ln()
    for l in range(L):
        p = "encoder.layer.%d." % l
        for n in ("query", "key", "value"):
            t[p + "attention.self.%s.weight" % n] = w(C, C) * 3
            t[p + "attention.self.%s.bias" % n] = w(C)
        t[p + "attention.output.dense.weight"], t[p + "attention.output.dense.bias"] = w(C, C), w(C)
        t[p + "attention.output.LayerNorm.weight"], t[p + "attention.output.LayerNorm.bias"] = ln()
        t[p + "intermediate.dense.weight"], t[p + "intermediate.dense.bias"] = w(F, C), w(F)
        t[p + "output.dense.weight"], t[p + "output.dense.bias"] = w(C, F), w(C)
        t[p + "output.LayerNorm.weight"], t[p + "output.LayerNorm.bias"] = ln()
    t["pooler.dense.weight"], t["pooler.dense.bias"] = w(C, C), w(C)
    cfg = {"architectures": ["BertModel"], "model_type": "bert", "hidden_size": C,
           "num_attention_heads": H, "num_hidden_layers": L, "intermediate_size": F,
           "vocab_size": V, "max_position_embeddings": P, "type_vocab_size": 2,
           "layer_norm_eps": 1e-12, "hidden_act": "gelu", "position_embedding_type": "absolute"}
    return cfg, t


def erf(x):
    from math import erf as e
    return np.vectorize(e)(x)


def layernorm(x, w, b, eps):
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) / np.sqrt(v + eps) * w + b


def bert_hidden(cfg, t, ids):
    """BertModel's last hidden state for one unpadded sequence, in float64."""
    g = {k: v.astype(np.float64) for k, v in t.items() if v.dtype == np.float32}
    eps, H = cfg["layer_norm_eps"], cfg["num_attention_heads"]
    n = len(ids)
    x = (g["embeddings.word_embeddings.weight"][ids] + g["embeddings.position_embeddings.weight"][:n]
         + g["embeddings.token_type_embeddings.weight"][0])
    x = layernorm(x, g["embeddings.LayerNorm.weight"], g["embeddings.LayerNorm.bias"], eps)
    C = x.shape[1]
    d = C // H
    for l in range(cfg["num_hidden_layers"]):
        p = "encoder.layer.%d." % l
        lin = lambda v, name: v @ g[p + name + ".weight"].T + g[p + name + ".bias"]
        q, k, v = (lin(x, "attention.self." + s).reshape(n, H, d).transpose(1, 0, 2)
                   for s in ("query", "key", "value"))
        s = q @ k.transpose(0, 2, 1) / np.sqrt(d)
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        a = (s @ v).transpose(1, 0, 2).reshape(n, C)
        x = layernorm(x + lin(a, "attention.output.dense"), g[p + "attention.output.LayerNorm.weight"],
                      g[p + "attention.output.LayerNorm.bias"], eps)
        h = lin(x, "intermediate.dense")
        h = 0.5 * h * (1 + erf(h / np.sqrt(2)))
        x = layernorm(x + lin(h, "output.dense"), g[p + "output.LayerNorm.weight"],
                      g[p + "output.LayerNorm.bias"], eps)
    return x


MODES = {"mean": "pooling_mode_mean_tokens", "cls": "pooling_mode_cls_token",
         "max": "pooling_mode_max_tokens", "mean_sqrt": "pooling_mode_mean_sqrt_len_tokens",
         "last": "pooling_mode_lasttoken"}


def pool(h, mode, normalize):
    v = {"mean": lambda: h.mean(0), "cls": lambda: h[0], "max": lambda: h.max(0),
         "mean_sqrt": lambda: h.sum(0) / np.sqrt(len(h)), "last": lambda: h[-1]}[mode]()
    return v / max(np.linalg.norm(v), 1e-12) if normalize else v


def write_st(d, cfg, t, mode, normalize, max_seq=None):
    os.makedirs(os.path.join(d, "1_Pooling"), exist_ok=True)
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
    write_safetensors(os.path.join(d, "model.safetensors"), t)
    mods = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    if normalize:
        mods.append({"idx": 2, "name": "2", "path": "2_Normalize",
                     "type": "sentence_transformers.models.Normalize"})
    json.dump(mods, open(os.path.join(d, "modules.json"), "w"))
    pc = {"word_embedding_dimension": cfg["hidden_size"]}
    pc.update({v: k == mode for k, v in MODES.items()})
    json.dump(pc, open(os.path.join(d, "1_Pooling", "config.json"), "w"))
    json.dump({"max_seq_length": max_seq or cfg["max_position_embeddings"], "do_lower_case": False},
              open(os.path.join(d, "sentence_bert_config.json"), "w"))


def write_gguf(path, cfg, t):
    """The same model as llama.cpp's converter writes the GGUF `bert` architecture (names,
    keys, mean pooling); no tokenizer (token-id inputs)."""
    import gguf
    w = gguf.GGUFWriter(path, "bert")
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_layer_norm_eps(cfg["layer_norm_eps"])
    w.add_causal_attention(False)
    w.add_pooling_type(gguf.PoolingType.MEAN)
    names = {"embeddings.word_embeddings.weight": "token_embd.weight",
             "embeddings.position_embeddings.weight": "position_embd.weight",
             "embeddings.token_type_embeddings.weight": "token_types.weight",
             "embeddings.LayerNorm.weight": "token_embd_norm.weight",
             "embeddings.LayerNorm.bias": "token_embd_norm.bias"}
    per = {"attention.self.query": "attn_q", "attention.self.key": "attn_k",
           "attention.self.value": "attn_v", "attention.output.dense": "attn_output",
           "attention.output.LayerNorm": "attn_output_norm", "intermediate.dense": "ffn_up",
           "output.dense": "ffn_down", "output.LayerNorm": "layer_output_norm"}
    for k, v in t.items():
        if k.startswith("encoder.layer."):
            l, rest = k[len("encoder.layer."):].split(".", 1)
            base, kind = rest.rsplit(".", 1)
            names[k] = "blk.%s.%s.%s" % (l, per[base], kind)
    for k, v in t.items():
        if k in names:
            w.add_tensor(names[k], v.astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def embed(d, inputs, *extra):
    p = subprocess.run([MEDLEY, "embed", "-m", d, "--ids", *extra],
                       input="".join(json.dumps(list(map(int, i))) + "\n" for i in inputs),
                       capture_output=True, text=True, timeout=300)
    if p.returncode:
        return None, p.stderr
    return [np.array(json.loads(l)) for l in p.stdout.splitlines()], p.stderr


def cosines(got, want):
    return [float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-30)) for a, b in zip(got, want)]


def compare(d, cfg, t, inputs, mode, normalize, what, *extra):
    got, err = embed(d, inputs, *extra)
    if got is None:
        check(False, what, err)
        return
    want = [pool(bert_hidden(cfg, t, i), mode, normalize) for i in inputs]
    cs = cosines(got, want)
    ok = len(got) == len(want) and min(cs) >= 0.9999
    if normalize:
        ok = ok and all(abs(np.linalg.norm(g) - 1) < 1e-4 for g in got)
    check(ok, "%s: min cosine %.7f over %d inputs" % (what, min(cs), len(cs)))


def hostile(tmp, cfg, t):
    d = os.path.join(tmp, "hostile")
    write_st(d, cfg, t, "mean", True)
    path = os.path.join(d, "model.safetensors")
    full = open(path, "rb").read()
    open(path, "wb").write(full[: len(full) // 2])
    _, err = embed(d, [[1, 2]])
    check("truncated" in err or "past the end" in err, "a truncated checkpoint is refused", err)
    bad = dict(t)
    bad["encoder.layer.1.intermediate.dense.weight"] = bad["encoder.layer.1.intermediate.dense.weight"][:, :32].copy()
    write_st(d, cfg, bad, "mean", True)
    _, err = embed(d, [[1, 2]])
    check("blk.1.ffn_up.weight" in err and "shape" in err, "a mis-shaped tensor is refused naming it", err)
    write_st(d, dict(cfg, hidden_act="relu"), t, "mean", True)
    _, err = embed(d, [[1, 2]])
    check("hidden_act" in err and "relu" in err, "an unknown activation is refused naming it", err)
    write_st(d, cfg, t, "mean", True)
    _, err = embed(d, [[1, 10**6]])
    check("vocabulary" in err, "a token id outside the vocabulary is refused", err)
    _, err = embed(d, [list(range(1, 70))])
    check("at most 64" in err, "an input past max_seq_length is refused naming the limit", err)
    got, err = embed(d, [list(range(1, 70))], "--truncate")
    want = pool(bert_hidden(cfg, t, list(range(1, 65))), "mean", True)
    check(got is not None and cosines(got, [want])[0] >= 0.9999, "--truncate cuts as sentence-transformers", err)


def decoder_last_token(tmp):
    """A decoder as an embedder (Qwen3-Embedding style): tests/fixtures/hf/tiny-qwen2 (random
    weights) with a Transformer + last-token Pooling pipeline; lm_head times each input's
    vector must give that position's logits of tests/fixtures/engine/tiny_logits.json (the
    same weights as a GGUF), the 8 prefixes packed into one step."""
    import shutil
    from safetensors.numpy import load_file
    src = os.path.join(SOURCE_DIR, "tests", "fixtures", "hf", "tiny-qwen2")
    d = os.path.join(tmp, "tiny-qwen2-embed")
    shutil.copytree(src, d)
    os.makedirs(os.path.join(d, "1_Pooling"))
    json.dump([{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}],
              open(os.path.join(d, "modules.json"), "w"))
    json.dump({"word_embedding_dimension": 64, "pooling_mode_lasttoken": True},
              open(os.path.join(d, "1_Pooling", "config.json"), "w"))
    fx = json.load(open(os.path.join(SOURCE_DIR, "tests", "fixtures", "engine", "tiny_logits.json")))
    fx = fx["models"]["tiny-qwen2.gguf"]
    inputs = [fx["tokens"][: p + 1] for p in fx["positions"]]
    got, err = embed(d, inputs)
    if got is None:
        check(False, "decoder last-token pooling", err)
        return
    w = load_file(os.path.join(d, "model.safetensors"))["lm_head.weight"].astype(np.float64)
    cs = cosines([w @ h for h in got], [np.array(l) for l in fx["logits"]])
    check(min(cs) >= 0.9999, "decoder (tiny qwen2) last-token pooling: lm_head x vector = the "
          "fixture's logits, min cosine %.7f over %d inputs" % (min(cs), len(cs)))
    os.remove(os.path.join(d, "modules.json"))
    _, err = embed(d, inputs[:1])
    check("last-token pooling" in err, "a decoder without a pipeline is refused", err)


def main():
    rng = np.random.default_rng(40)
    cfg, t = random_bert(rng)
    inputs = [rng.integers(1, cfg["vocab_size"], size=n) for n in (1, 2, 5, 17, 40, 33, 8, 64, 3)]
    with tempfile.TemporaryDirectory() as tmp:
        for mode in MODES:
            for normalize in (True, False):
                d = os.path.join(tmp, "%s-%d" % (mode, normalize))
                write_st(d, cfg, t, mode, normalize)
                compare(d, cfg, t, inputs, mode, normalize, "%s pooling, normalize %s" % (mode, normalize))
        d = os.path.join(tmp, "mean-1")
        compare(d, cfg, t, inputs, "mean", True, "steps of 64 tokens (one input a step or several)",
                "--step-tokens", "64")
        compare(d, cfg, t, inputs, "mean", True, "cpu-exact backend", "--device", "cpu-exact")
        g = os.path.join(tmp, "bert.gguf")
        write_gguf(g, cfg, t)
        compare(g, cfg, t, inputs, "mean", True, "GGUF bert (llama.cpp's names and keys), mean pooling")
        hostile(tmp, cfg, t)
        decoder_last_token(tmp)
    real = os.environ.get("MEDLEY_EMBED_MODEL")
    if real:
        from safetensors.numpy import load_file
        rt = load_file(os.path.join(real, "model.safetensors"))
        rt = {k[5:] if k.startswith("bert.") else k: v for k, v in rt.items()}
        rcfg = json.load(open(os.path.join(real, "config.json")))
        ins = [rng.integers(1000, rcfg["vocab_size"], size=n) for n in (5, 30, 120, 256)]
        ins = [np.concatenate([[101], i[1:-1], [102]]) for i in ins]
        compare(real, rcfg, rt, ins, "mean", True, os.path.basename(real.rstrip("/")))
    print("%d failure(s)" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

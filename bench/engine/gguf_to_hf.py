#!/usr/bin/env python3
"""A GGUF model dequantized into a BF16 Hugging Face directory (config.json, tokenizer files,
model.safetensors), so that engines which cannot read GGUF (vLLM's CPU backend) run the same
weights as medley does: bench_workloads.py's vLLM peer, issue 41. Bench-only.

  /opt/vllm-venv/bin/python bench/engine/gguf_to_hf.py \\
      ~/.cache/medley/models/SmolLM2-135M-Instruct.Q4_1.gguf /tmp/smollm2-135m-bf16

Uses transformers' GGUF reader (`from_pretrained(dir, gguf_file=...)`, needs the `gguf`
package): it dequantizes every tensor with gguf-py, undoes llama.cpp's permutation of the
Q and K rows (LLaMA-family) and Gemma's norm offset, and builds the tokenizer from the file's
vocabulary (the file's add_bos_token / add_eos_token written back: transformers drops them);
the result is saved in BF16. The dequantized values are the GGUF's values (Q4_1 ->
BF16 rounds each one once), not the original checkpoint's. transformers supports the GGUF
architectures listed in transformers/integrations/ggml.py (llama and gemma3 among them).
"""
import argparse
import json
import os
import sys


def gguf_flags(path):
    """The GGUF's tokenizer.ggml.add_bos_token / add_eos_token (None where absent)."""
    from gguf import GGUFReader
    r = GGUFReader(path)
    out = []
    for k in ("tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_eos_token"):
        fld = r.fields.get(k)
        out.append(bool(fld.parts[fld.data[0]][0]) if fld else None)
    return out


def fix_special(out, tok, add_bos, add_eos):
    """Write the GGUF's add_bos / add_eos into the saved tokenizer: tokenizer_config.json's
    flags, and a TemplateProcessing post-processor that adds them (what the HF checkpoints
    of these models ship)."""
    cfg_path = os.path.join(out, "tokenizer_config.json")
    with open(cfg_path) as fh:
        cfg = json.load(fh)
    bos = add_bos and tok.bos_token
    eos = add_eos and tok.eos_token
    cfg["add_bos_token"], cfg["add_eos_token"] = bool(bos), bool(eos)
    with open(cfg_path, "w") as fh:
        json.dump(cfg, fh, indent=2)
    tj_path = os.path.join(out, "tokenizer.json")
    with open(tj_path) as fh:
        tj = json.load(fh)
    single = ([{"SpecialToken": {"id": bos, "type_id": 0}}] if bos else []) + \
        [{"Sequence": {"id": "A", "type_id": 0}}] + \
        ([{"SpecialToken": {"id": eos, "type_id": 0}}] if eos else [])
    pair = single + [{"Sequence": {"id": "B", "type_id": 1}}]
    special = {t: {"id": t, "ids": [tok.convert_tokens_to_ids(t)], "tokens": [t]}
               for t in (bos, eos) if t}
    tj["post_processor"] = {"type": "TemplateProcessing", "single": single, "pair": pair,
                            "special_tokens": special}
    with open(tj_path, "w") as fh:
        json.dump(tj, fh, ensure_ascii=False)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("gguf", help="the GGUF file")
    ap.add_argument("out", help="output directory (created)")
    ap.add_argument("--check", default="The capital of France is",
                    help="prompt whose greedy continuation (8 tokens) is printed after saving")
    args = ap.parse_args()
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as e:
        sys.exit(f"gguf_to_hf: {e} (run with the vLLM venv's python: it has torch and "
                 "transformers; `pip install gguf` into it)")
    src = os.path.abspath(os.path.expanduser(args.gguf))
    d, f = os.path.dirname(src), os.path.basename(src)
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    add_bos, add_eos = gguf_flags(src)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.bfloat16)
    # transformers marks a GGUF-loaded model as quantized (QuantizationMethod.GGUF) and will
    # not save it, though its tensors are dequantized: the same weights in a plain model
    cfg = model.config
    if hasattr(cfg, "quantization_config"):
        delattr(cfg, "quantization_config")
    plain = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    missing, unexpected = plain.load_state_dict(model.state_dict(), strict=False)
    missing = [k for k in missing if k not in plain._tied_weights_keys]  # tied: lm_head
    if missing or unexpected:
        sys.exit(f"gguf_to_hf: weights not carried over: missing {missing}, "
                 f"unexpected {unexpected}")
    model = plain.eval()
    os.makedirs(args.out, exist_ok=True)
    model.save_pretrained(args.out, safe_serialization=True)
    tok.save_pretrained(args.out)
    # transformers' GGUF tokenizer drops the file's add_bos_token (Gemma's BOS): the flags
    # as the file gives them, in tokenizer_config.json and in tokenizer.json's post-processor
    fix_special(args.out, tok, add_bos, add_eos)
    tok = AutoTokenizer.from_pretrained(args.out)
    with open(os.path.join(args.out, "config.json")) as fh:
        cfg = json.load(fh)
    n = sum(p.numel() for p in model.parameters())
    print(f"{args.out}: {cfg.get('architectures')} {cfg.get('model_type')}, "
          f"{n / 1e6:.1f} M parameters, dtype {cfg.get('dtype', cfg.get('torch_dtype'))}")
    if args.check:
        ids = tok(args.check, return_tensors="pt").input_ids
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=8, do_sample=False)
        new = out[0, ids.shape[1]:].tolist()
        print(f"check: prompt ids {ids[0].tolist()} -> greedy {new} "
              f"{tok.decode(new)!r}")


if __name__ == "__main__":
    main()

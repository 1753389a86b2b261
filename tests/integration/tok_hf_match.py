#!/usr/bin/env python3
"""`medley tokenize` on Hugging Face tokenizer.json directories equals the `tokenizers` package.

tests/fixtures/tokenizer/make_hf_tokenizer.py builds the directories in a temporary folder:
SmolLM2's vocabulary under its own pre-tokenizer and under Llama 3's, Qwen2's and other
layouts (needs the SmolLM2 GGUF; scripts/fetch-model.sh), and SentencePiece-style ones from
spm_tiny.gguf (always). Every text of tests/fixtures/tokenizer/smollm2_corpus.json (312: the
19 invalid UTF-8 ones enter as Python's replacement decoding, since `tokenizers` takes only
str) is encoded by both, with special tokens parsed (medley's default, tokenizers' default)
and not (--no-special, encode_special_tokens = True); ids and vocabulary strings must be
identical.

    python3 tests/integration/tok_hf_match.py [MEDLEY_BIN] [SMOLLM2.gguf]
"""
import json
import os
import sys
import tempfile

from tok_match_util import FIXTURES, compare, corpus, medley, models_dir, reference

sys.path.insert(0, FIXTURES)
import make_hf_tokenizer  # noqa: E402


def model_path():
    if len(sys.argv) > 2:
        return sys.argv[2]
    return os.path.join(models_dir(), "SmolLM2-135M-Instruct.Q4_1.gguf")


def encode(binary, d, texts, special):
    """ids and vocabulary strings per text, from medley and from tokenizers."""
    got = [json.loads(line) for line in medley(binary, ["-m", d], ["--json"], texts, special,
                                               timeout=120)]
    tok = reference(os.path.join(d, "tokenizer.json"), special)
    want = [{"ids": enc.ids, "pieces": [tok.id_to_token(i) for i in enc.ids]}
            for enc in tok.encode_batch(texts, add_special_tokens=True)]
    return got, want


def main():
    binary = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("MEDLEY_BIN",
                                                                   "build/cli/medley")
    texts = corpus()
    have_model = os.path.exists(model_path())
    if not have_model:
        print(f"tok_hf_match: {model_path()} not fetched: only the SentencePiece variants run")
    failures = 0
    with tempfile.TemporaryDirectory(prefix="medley-hftok-") as tmp:
        variants = list(make_hf_tokenizer.SPM_VARIANTS)
        for name in make_hf_tokenizer.SPM_VARIANTS:
            make_hf_tokenizer.sentencepiece(name, tmp)
        if have_model:
            g = make_hf_tokenizer.read_gguf(model_path())
            for name in make_hf_tokenizer.SMOLLM_VARIANTS:
                make_hf_tokenizer.byte_level(g, name, tmp)
            variants += make_hf_tokenizer.SMOLLM_VARIANTS
        for name in variants:
            d = os.path.join(tmp, name)
            for special in (True, False):
                got, want = encode(binary, d, texts, special)
                mode = "special" if special else "no-special"
                failures += compare(f"{name:11s} {mode:10s}", texts, got, want,
                                    lambda r: r["ids"])
    if failures:
        raise SystemExit(f"tok_hf_match: {failures} texts differ")
    print("tok_hf_match: ok")


if __name__ == "__main__":
    main()

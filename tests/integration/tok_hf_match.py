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
import subprocess
import sys
import tempfile

from tokenizers import Tokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "..", "fixtures", "tokenizer")
sys.path.insert(0, FIXTURES)
import make_hf_tokenizer  # noqa: E402


def model_path():
    if len(sys.argv) > 2:
        return sys.argv[2]
    d = os.environ.get("MEDLEY_MODELS") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "medley", "models")
    return os.path.join(d, "SmolLM2-135M-Instruct.Q4_1.gguf")


def corpus():
    with open(os.path.join(FIXTURES, "smollm2_corpus.json")) as f:
        cases = json.load(f)["cases"]
    return [c["text"] if "text" in c else bytes.fromhex(c["hex"]).decode("utf-8", "replace")
            for c in cases]


def medley(binary, d, texts, special):
    args = [binary, "tokenize", "-m", d, "--json", "--jsonl", "-"]
    if not special:
        args.insert(-1, "--no-special")
    stdin = "".join(json.dumps(t) + "\n" for t in texts)
    p = subprocess.run(args, input=stdin.encode(), capture_output=True, timeout=120)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(args)}: exit {p.returncode}: {p.stderr.decode()[-2000:]}")
    lines = p.stdout.decode().splitlines()
    assert len(lines) == len(texts), (len(lines), len(texts))
    return [json.loads(line) for line in lines]


def reference(d, texts, special):
    tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    tok.encode_special_tokens = not special
    out = []
    for enc in tok.encode_batch(texts, add_special_tokens=True):
        out.append({"ids": enc.ids, "pieces": [tok.id_to_token(i) for i in enc.ids]})
    return out


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
                got, want = medley(binary, d, texts, special), reference(d, texts, special)
                bad = [i for i in range(len(texts)) if got[i] != want[i]]
                mode = "special" if special else "no-special"
                print(f"{name:11s} {mode:10s}: {len(texts) - len(bad)}/{len(texts)} identical")
                for i in bad[:3]:
                    print(f"  text {i} {texts[i]!r:.80}\n    medley     {got[i]['ids']}\n"
                          f"    tokenizers {want[i]['ids']}")
                failures += len(bad)
    if failures:
        raise SystemExit(f"tok_hf_match: {failures} texts differ")
    print("tok_hf_match: ok")


if __name__ == "__main__":
    main()

"""What the `medley tokenize` against `tokenizers` tests share (tok_hf_match.py,
tok_wordpiece_match.py): where fetched models are, the corpus, running `medley tokenize` over
texts in one call, the reference encoder, and comparing and reporting one set."""
import json
import os
import subprocess

from tokenizers import Tokenizer

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures",
                        "tokenizer")


def models_dir():
    """The folder `medley models fetch` writes to (MEDLEY_MODELS, else the XDG cache)."""
    return os.environ.get("MEDLEY_MODELS") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "medley", "models")


def corpus():
    """tests/fixtures/tokenizer/smollm2_corpus.json's texts; invalid UTF-8 enters as Python's
    replacement decoding, since `tokenizers` takes only str."""
    with open(os.path.join(FIXTURES, "smollm2_corpus.json")) as f:
        cases = json.load(f)["cases"]
    return [c["text"] if "text" in c else bytes.fromhex(c["hex"]).decode("utf-8", "replace")
            for c in cases]


def medley(binary, source, output, texts, special, timeout=600):
    """`medley tokenize SOURCE OUTPUT [--no-special] --jsonl -` over texts (one JSON string a
    line); source picks the tokenizer (["-m", dir] or ["--tokenizer", file]), output the form
    (["--json"] or ["--ids"]). Returns stdout's lines, one per text; exits naming the command
    when it fails."""
    args = [binary, "tokenize", *source, *output, "--jsonl", "-"]
    if not special:
        args.insert(-1, "--no-special")
    stdin = "".join(json.dumps(t) + "\n" for t in texts)
    p = subprocess.run(args, input=stdin.encode(), capture_output=True, timeout=timeout)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(args)}: exit {p.returncode}: {p.stderr.decode()[-2000:]}")
    lines = p.stdout.decode().splitlines()
    assert len(lines) == len(texts), (len(lines), len(texts))
    return lines


def reference(tok_file, special):
    """The `tokenizers` encoder of tok_file as medley applies it: no truncation or padding
    (docs/tokenizer.md), special tokens parsed in text only when special."""
    tok = Tokenizer.from_file(tok_file)
    tok.no_truncation()
    tok.no_padding()
    tok.encode_special_tokens = not special
    return tok


def compare(label, texts, got, want, show=lambda x: x, width=80):
    """Prints how many of got and want agree under label, and the first three that do not
    (each through show). Returns the number that differ."""
    bad = [i for i in range(len(texts)) if got[i] != want[i]]
    print(f"{label}: {len(texts) - len(bad)}/{len(texts)} identical")
    for i in bad[:3]:
        print(f"  text {i} {texts[i]!r:.{width}}\n    medley     {show(got[i])}\n"
              f"    tokenizers {show(want[i])}")
    return len(bad)

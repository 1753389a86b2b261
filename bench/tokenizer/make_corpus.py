#!/usr/bin/env python3
"""Deterministic >= 10 MB mixed text for the tokenizer benchmark.

    python3 bench/tokenizer/make_corpus.py [OUT] [MEGABYTES]   (default /tmp/medley-tok-corpus.txt, 12)

Built from the tokenizer fixture corpus (tests/fixtures/tokenizer/smollm2_corpus.json: prose,
code, numbers, whitespace runs, accented, CJK and other scripts, emoji, special-token text,
invalid UTF-8) and from generated text with a fixed seed: English-like prose over a word list,
C/Python-like code, number tables, and paragraphs in several scripts. Same bytes on every run
and machine (only the standard library is used). One document per line is NOT assumed: the
benchmark tokenizes the whole file as one text and, separately, line by line.
"""
import json
import os
import random
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURE = os.path.join(HERE, "..", "..", "tests", "fixtures", "tokenizer", "smollm2_corpus.json")

WORDS = (
    "the of and to in is that for it as was with be by on not he this are or his from at which "
    "but have an they you were her she there one all we their has been would will when who more "
    "if no out so said what up its about into than them can only other new some could time these "
    "two may then do first any my now such like our over man me even most made after also did "
    "many before must through back years where much your way well down should because each just "
    "those people how too little state good very make world still own see men work long get here "
    "between both life being under never day same another know while last might us great old year "
    "off come since against go came right used take three inference batch token model request "
    "worker queue scheduler throughput latency memory device kernel matrix vector attention "
    "cache prefix decode prefill sample temperature deadline replica fleet budget dollars"
).split()

SCRIPTS = [
    "中文文本用于测试分词器的性能和正确性，包括标点符号。",
    "日本語の文章はひらがな、カタカナ、漢字が混ざっています。",
    "한국어 문장은 띄어쓰기를 사용합니다. 토크나이저 테스트입니다.",
    "Русский текст для проверки токенизатора, с запятыми и точками.",
    "Ελληνικό κείμενο για δοκιμή του διαχωριστή λέξεων.",
    "النص العربي لاختبار أداء المقسم اللغوي.",
    "हिन्दी पाठ टोकनाइज़र के परीक्षण के लिए है।",
    "Le café était déjà fermé; naïve façade, crème brûlée à volonté.",
    "Emoji 😀🎉👍🏽 and symbols ★☆♥ ∑∫√ € £ ¥ ™ appear here 🚀.",
]


def prose(rnd, n_words):
    out, line = [], []
    for i in range(n_words):
        w = rnd.choice(WORDS)
        if not line:
            w = w.capitalize()
        line.append(w)
        r = rnd.random()
        if r < 0.06:
            line[-1] += ","
        elif r < 0.10:
            line[-1] += "."
            out.append(" ".join(line))
            line = []
        elif r < 0.11:
            line[-1] += "'s"
        elif r < 0.12:
            line.append(str(rnd.randint(0, 100000)))
    if line:
        out.append(" ".join(line) + ".")
    return " ".join(out)


def code(rnd):
    name = rnd.choice(WORDS) + "_" + rnd.choice(WORDS)
    a, b = rnd.randint(0, 999), rnd.randint(1, 64)
    if rnd.random() < 0.5:
        return (f"static int {name}(const float *x, size_t n) {{\n"
                f"    float acc = {a}.0f;\n    for (size_t i = 0; i < n; i += {b}) {{\n"
                f"        acc += x[i] * 0.5f; /* {rnd.choice(WORDS)} */\n    }}\n"
                f"    return acc > {a} ? 1 : -1;\n}}\n")
    return (f"def {name}(items, limit={a}):\n    \"\"\"{prose(rnd, 8)}\"\"\"\n"
            f"    out = [x ** 2 for x in items if x % {b} == 0]\n"
            f"    return {{'n': len(out), 'sum': sum(out)}}  # {rnd.choice(WORDS)}\n")


def numbers(rnd):
    rows = []
    for _ in range(rnd.randint(3, 8)):
        rows.append("\t".join("%d" % rnd.randint(0, 10 ** rnd.randint(1, 9)) if rnd.random() < .5
                              else "%.4f" % rnd.uniform(-1e4, 1e4) for _ in range(5)))
    return "\n".join(rows)


def fixture_texts():
    with open(FIXTURE, encoding="utf-8") as f:
        doc = json.load(f)
    out = []
    for c in doc["cases"]:
        out.append(c["text"].encode("utf-8") if "text" in c else bytes.fromhex(c["hex"]))
    return out


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "/tmp/medley-tok-corpus.txt"
    target = int(float(sys.argv[2]) * 1e6) if len(sys.argv) > 2 else 12_000_000
    rnd = random.Random(1234567)
    fix = fixture_texts()
    parts, size = [], 0
    while size < target:
        r = rnd.random()
        if r < 0.45:
            p = prose(rnd, rnd.randint(20, 200)).encode()
        elif r < 0.65:
            p = code(rnd).encode()
        elif r < 0.72:
            p = numbers(rnd).encode()
        elif r < 0.85:
            p = " ".join(rnd.choice(SCRIPTS) for _ in range(rnd.randint(1, 4))).encode()
        else:
            p = rnd.choice(fix)
        sep = rnd.choice([b"\n", b"\n\n", b" ", b"\n    "])
        parts.append(p + sep)
        size += len(p) + len(sep)
    with open(path, "wb") as f:
        f.write(b"".join(parts))
    print("%s: %d bytes" % (path, size))


if __name__ == "__main__":
    main()

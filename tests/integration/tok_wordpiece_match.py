#!/usr/bin/env python3
"""`medley tokenize` on BERT WordPiece tokenizer.json files equals the `tokenizers` package.

The tokenizer is all-MiniLM-L6-v2's (`medley models fetch all-minilm-l6-v2`; exit 77, a
skip, when it is not fetched), as shipped (uncased: lowercase, strip_accents null) and two
variants made from the same file by flipping the BertNormalizer: "cased" (lowercase false,
so accents stay too, as bert-base-multilingual-cased) and "lower-accents" (lowercase true,
strip_accents false). Texts:
  - tests/fixtures/tokenizer/smollm2_corpus.json (312; invalid UTF-8 enters as Python's
    replacement decoding, since `tokenizers` takes only str);
  - 10,000 lines generated here from a fixed seed: Latin with precomposed and combining
    accents, CJK, Hangul, kana, Cyrillic, Greek, Arabic, Hebrew, Devanagari, Thai, emoji
    (ZWJ sequences, skin tones, flags), ASCII and Unicode punctuation, whitespace and
    control characters, digits, words past max_input_chars_per_word, special-token text;
  - every code point but the surrogates, 64 to a text, each between Latin letters, which
    checks the character classes of engine/tokenizer/tokenizer_wordpiece_ucd.c (17,376
    texts; skipped with --quick).
`medley tokenize -m all-minilm-l6-v2 "Hello world"` must give tokenizers' ids too. Texts are
encoded with special tokens parsed ([CLS] ... [SEP]; medley's default); through the shipped
file also with them not parsed (--no-special, encode_special_tokens); the code points go
through the uncased and lower-accents files (cased adds no rule for them). Ids must be
identical. The file's truncation and padding are turned off in `tokenizers` (medley does
not apply them; docs/tokenizer.md).

    python3 tests/integration/tok_wordpiece_match.py [MEDLEY_BIN] [--quick]
"""
import json
import os
import random
import subprocess
import sys
import tempfile

from tok_match_util import compare, corpus, medley, models_dir, reference

SKIP = 77


def model_dir():
    return os.path.join(models_dir(), "all-MiniLM-L6-v2")


# Pieces the generated lines are made of, by script.
ALPHABETS = {
    "latin": "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ",
    "accented": "àáâãäåæçèéêëìíîïðñòóôõöøùúûüýþÿÀÉÎÕÜŁłŒœŠšŽžßẞİıǅǈḀṩẞ",
    "combining": "\u0300\u0301\u0302\u0303\u0308\u030a\u0327\u0328\u0323\u0345\u05b4"
                 "\u0670\u093c\u0e31\u302a\u20dd\u0488",
    "cyrillic": "абвгдеёжзийклмнопрстуфхцчшщъыьэюяАБВГДЕЁЖЗИЙКЛМНОПРСТУФХЦЧШЩЪЫЬЭЮЯіїєґ",
    "greek": "αβγδεζηθικλμνξοπρσςτυφχψωΑΒΓΔΕΖΗΘΙΚΛΜΝΞΟΠΡΣΤΥΦΧΨΩάέήίόύώϊϋΐΰ",
    "arabic": "ابتثجحخدذرزسشصضطظعغفقكلمنهويءآأؤإئةى٠١٢٣٤٥٦٧٨٩،؛؟\u064b\u064e\u0650\u0651",
    "hebrew": "אבגדהוזחטיכלמנסעפצקרשתךםןףץ\u05b0\u05b7\u05bc",
    "devanagari": "अआइईउऊएऐओऔकखगघङचछजझञटठडढणतथदधनपफबभमयरलवशषसह\u093e\u093f\u0940\u0941"
                  "\u0947\u094d।॥०१२",
    "thai": "กขคงจฉชซญดตถทธนบปผพฟภมยรลวศษสหอฮ\u0e31\u0e34\u0e35\u0e48\u0e49ะาำเแโ",
    "cjk": "的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着去之"
           "過於學習東京北京語言漢字㐀㐁𠀀𠀁𪜀𫝀𬺰豈更丽",
    "kana": "あいうえおかきくけこさしすせそたちつてとなにぬねのはひふへほまみむめもやゆよらりるれろわをん"
            "アイウエオカキクケコガギグゲゴパピプペポーッ",
    "hangul": "가나다라마바사아자차카타파하한국어조선말글\u1100\u1161\u11a8",
    "digits": "0123456789٠١٢३४५０１２",
    "punct": "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~¡¿«»‹›‘’‚“”„†‡•…‰′″※‼⁇⁈⁉、。〈〉《》「」『』【】〔〕〜・"
             "–—―¶§©®™°±×÷€£¥₹₽¢",
    "emoji": "😀😂🥲🤖👍🏽👩\u200d💻🏳️\u200d🌈🇫🇷🇯🇵❤️✨🔥🎉🚀🧪",
    "space": " \t\n\r\u00a0\u2003\u3000\u2028\u0085\u000b\u000c",
    "control": "\u0000\u0001\u001f\u007f\u200b\u200d\u200e\u2066\ufeff\ue000\U000f0001\ufffd",
}
WORDS = ["the", "of", "unaffable", "naïve", "café", "Straße", "İstanbul", "ΣΟΦΟΣ", "Москва",
         "東京都", "don't", "e-mail", "U.S.A.", "[MASK]", "[CLS]", "[SEP]", "[UNK]", "[PAD]",
         "##ing", "##", "hello", "HELLO", "Hello,", "co-operate", "résumé", "Ⅻ", "ǅemal",
         "ﬁnance", "x²", "½", "1,234.56", "http://example.com/a?b=c", "C++", "naïveté"]


def word(rng):
    r = rng.random()
    if r < 0.25:
        return rng.choice(WORDS)
    if r < 0.3:  # past max_input_chars_per_word (100), or just below it
        return "".join(rng.choice(ALPHABETS["latin"]) for _ in range(rng.choice([99, 100, 101,
                                                                                  180])))
    script = rng.choice(list(ALPHABETS))
    n = rng.randint(1, 12)
    out = []
    for _ in range(n):
        out.append(rng.choice(ALPHABETS[script]))
        if script in ("latin", "cyrillic", "greek") and rng.random() < 0.15:
            out.append(rng.choice(ALPHABETS["combining"]))
    return "".join(out)


def generated(n, seed=40):
    rng = random.Random(seed)
    lines = []
    for _ in range(n):
        words = [word(rng) for _ in range(rng.randint(1, 16))]
        seps = [rng.choice([" ", " ", " ", "", "\t", "  ", "\u3000", "\n"]) for _ in words]
        lines.append("".join(w + s for w, s in zip(words, seps)))
    return lines


def every_codepoint():
    """One text per 64 code points: each between Latin letters, so a class decides a split."""
    cps = [c for c in range(1, 0x110000) if not 0xD800 <= c <= 0xDFFF]
    return ["".join("a" + chr(c) + "B" for c in cps[i:i + 64]) for i in range(0, len(cps), 64)]


def variants(src, tmp):
    with open(src) as f:
        j = json.load(f)
    out = {}
    for name, lower, strip in (("uncased", True, None), ("cased", False, None),
                               ("lower-accents", True, False)):
        v = json.loads(json.dumps(j))
        v["normalizer"]["lowercase"] = lower
        v["normalizer"]["strip_accents"] = strip
        d = os.path.join(tmp, name)
        os.makedirs(d)
        with open(os.path.join(d, "tokenizer.json"), "w") as f:
            json.dump(v, f, ensure_ascii=False)
        out[name] = os.path.join(d, "tokenizer.json")
    return out


def encode(binary, tok, texts, special):
    """ids per text, from medley and from tokenizers."""
    got = [[int(x) for x in line.split()]
           for line in medley(binary, ["--tokenizer", tok], ["--ids"], texts, special)]
    ref = reference(tok, special)
    return got, [e.ids for e in ref.encode_batch(texts, add_special_tokens=True)]


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    binary = args[0] if args else os.environ.get("MEDLEY_BIN", "build/cli/medley")
    src = os.path.join(model_dir(), "tokenizer.json")
    if not os.path.exists(src):
        print(f"tok_wordpiece_match: {src} not fetched (medley models fetch all-minilm-l6-v2)")
        sys.exit(SKIP)
    sets = {"corpus": corpus(), "generated": generated(10000)}
    if "--quick" not in sys.argv:
        sets["codepoints"] = every_codepoint()
    failures = 0
    # the registered name resolves to the fetched directory and its tokenizer.json
    p = subprocess.run([binary, "tokenize", "-m", "all-minilm-l6-v2", "--ids", "Hello world"],
                       capture_output=True, timeout=60)
    by_name = [int(x) for x in p.stdout.decode().split()]
    want = reference(src, True).encode("Hello world", add_special_tokens=True).ids
    if p.returncode != 0 or by_name != want:
        print(f"tokenize -m all-minilm-l6-v2: exit {p.returncode}, {by_name}, "
              f"{p.stderr.decode()[-500:]}")
        failures += 1
    with tempfile.TemporaryDirectory(prefix="medley-wptok-") as tmp:
        for name, tok in variants(src, tmp).items():
            for set_name, texts in sets.items():
                for special in (True, False) if name == "uncased" else (True,):
                    if set_name == "codepoints" and (not special or name == "cased"):
                        continue
                    got, want = encode(binary, tok, texts, special)
                    mode = "special" if special else "no-special"
                    failures += compare(f"{name:13s} {set_name:10s} {mode:10s}", texts, got,
                                        want, width=200)
    if failures:
        raise SystemExit(f"tok_wordpiece_match: {failures} texts differ")
    print("tok_wordpiece_match: ok")


if __name__ == "__main__":
    main()

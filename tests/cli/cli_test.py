"""The tinyserve CLI as a user meets it: streaming output, summaries, --help, and one-line errors.

Usage: cli_test.py /path/to/tinyserve   (cwd: the source root, so ../shared/data resolves)
"""
import os
import subprocess
import sys
import unittest

BIN = None
DATA = os.environ.get("TINYSERVE_DATA", "../shared/data")
STORIES = os.path.join(DATA, "models", "stories260K", "stories260K.gguf")


def run(*args, timeout=120):
    p = subprocess.run([BIN, *args], capture_output=True, timeout=timeout)
    return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")


class Generate(unittest.TestCase):
    def test_streams_text_and_summary(self):
        code, out, err = run("generate", "--model", STORIES, "--prompt", "Once upon a time",
                             "--max-tokens", "24")
        self.assertEqual(code, 0, err)
        self.assertTrue(out.startswith(", there was a little girl named Lily."), out)
        summary = [l for l in err.splitlines() if l.startswith("prompt ")]
        self.assertEqual(len(summary), 1, err)
        self.assertIn("prompt 5 tokens, generated 24 tokens", summary[0])
        self.assertIn("decode", summary[0])

    def test_sampling_flags_and_seed(self):
        args = ["generate", "--model", STORIES, "--prompt", "Once upon a time", "--max-tokens",
                "30", "--temperature", "0.9", "--top-k", "40", "--top-p", "0.95", "--seed", "3"]
        a, b = run(*args), run(*args)
        self.assertEqual(a[0], 0, a[2])
        self.assertEqual(a[1], b[1])

    def test_selection_flags_and_trace(self):
        trace = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"ts_trace_{os.getpid()}.jsonl")
        code, out, err = run("generate", "--model", STORIES, "--prompt", "Once upon a time",
                             "--max-tokens", "60", "--policy", "quest", "--budget", "16",
                             "--page-size", "8", "--dense-layers", "1", "--oracle-every", "2",
                             "--trace", trace)
        self.assertEqual(code, 0, err)
        self.assertIn("quest:", err)
        with open(trace) as f:
            lines = f.read().splitlines()
        os.unlink(trace)
        self.assertGreater(len(lines), 40)
        self.assertIn('"pages_selected"', lines[-1])


    def test_grammar_holds_the_output(self):
        grammar = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"ts_grammar_{os.getpid()}.gbnf")
        with open(grammar, "w") as f:
            f.write('# a GBNF file, as llama.cpp reads it\n'
                    'root ::= " " name " had a " pet ("." | "!") (" " name " was " feeling ".")?\n'
                    'name ::= "Lily" | "Tom" | "Sue"\n'
                    'pet  ::= ("big " | "little ")? ("dog" | "cat" | "bird")\n'
                    'feeling ::= [a-z]{3,10}\n')
        import re
        pattern = (r" (Lily|Tom|Sue) had a ((big|little) )?(dog|cat|bird)[.!]"
                   r"( (Lily|Tom|Sue) was [a-z]{3,10}\.)?")
        try:
            for extra in ([], ["--temperature", "1", "--seed", "5"], ["--temperature", "1",
                                                                      "--seed", "9"]):
                code, out, err = run("generate", "--model", STORIES, "--prompt",
                                     "Once upon a time,", "--max-tokens", "60",
                                     "--grammar-file", grammar, *extra)
                self.assertEqual(code, 0, err)
                self.assertIsNotNone(re.fullmatch(pattern, out.rstrip("\n")), out)
        finally:
            os.unlink(grammar)


class Errors(unittest.TestCase):
    def check(self, field, *args):
        code, out, err = run(*args)
        self.assertNotEqual(code, 0, f"{args} succeeded")
        lines = [l for l in err.splitlines() if l.strip() and not l.startswith("I ")]
        self.assertEqual(len(lines), 1, err)
        self.assertTrue(lines[0].startswith("error: "), lines[0])
        self.assertIn(field, lines[0])

    def test_bad_inputs_name_the_problem(self):
        base = ["generate", "--model", STORIES]
        self.check("prompt", *base, "--prompt", "")
        self.check("max_tokens", *base, "--prompt", "hi", "--max-tokens", "0")
        self.check("max_tokens", *base, "--prompt", "hi", "--max-tokens", "-3")
        self.check("temperature", *base, "--prompt", "hi", "--temperature", "-1")
        self.check("top_p", *base, "--prompt", "hi", "--top-p", "1.5")
        self.check("top_k", *base, "--prompt", "hi", "--top-k", "-1")
        self.check("repetition_penalty", *base, "--prompt", "hi", "--repetition-penalty", "0")
        self.check("selection.policy", *base, "--prompt", "hi", "--policy", "bogus")
        self.check("grammar: line 2, column 2: expecting ::=", *base, "--prompt", "hi",
                   "--grammar", 'root ::= "a"\nb')
        self.check("--grammar-file: cannot open /nonexistent.gbnf", *base, "--prompt", "hi",
                   "--grammar-file", "/nonexistent.gbnf")
        self.check("--max-tokens", *base, "--prompt", "hi", "--max-tokens", "many")
        self.check("--nope", *base, "--prompt", "hi", "--nope")
        self.check("/nonexistent/model.gguf", "generate", "--model", "/nonexistent/model.gguf",
                   "--prompt", "hi")
        long_prompt = " ".join(["Once upon a time there was a dog."] * 400)  # > 2048 tokens
        self.check("prompt", *base, "--prompt", long_prompt)

    def test_corrupt_model_file(self):
        path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"ts_bad_{os.getpid()}.gguf")
        with open(path, "wb") as f:
            f.write(b"GGUF\x03\x00\x00\x00" + b"\xff" * 64)
        try:
            self.check("gguf", "generate", "--model", path, "--prompt", "hi")
        finally:
            os.unlink(path)

    def test_unknown_command(self):
        code, _, err = run("frobnicate")
        self.assertEqual(code, 2)
        self.assertIn("unknown command", err)


class Embed(unittest.TestCase):
    def test_prints_one_vector_per_input(self):
        import json
        import math
        args = ["embed", "--model", STORIES, "--input", "Once upon a time", "--input", "The dog",
                "--input", "Once upon a time"]
        code, out, err = run(*args)
        self.assertEqual(code, 0, err)
        rows = [json.loads(l) for l in out.splitlines()]
        self.assertEqual([r["index"] for r in rows], [0, 1, 2])
        self.assertEqual(rows[0]["tokens"], 5)  # BOS + 4, as generate counts them
        for r in rows:
            self.assertEqual(len(r["embedding"]), 64)  # stories260K's width
            self.assertAlmostEqual(math.sqrt(sum(x * x for x in r["embedding"])), 1.0, places=5)
        self.assertEqual(rows[0]["embedding"], rows[2]["embedding"])
        self.assertNotEqual(rows[0]["embedding"], rows[1]["embedding"])
        code, out, err = run("embed", "--model", STORIES, "--input", "Once upon a time",
                             "--pooling", "mean", "--no-normalize")
        self.assertEqual(code, 0, err)
        mean = json.loads(out)["embedding"]
        self.assertNotAlmostEqual(math.sqrt(sum(x * x for x in mean)), 1.0, places=2)

    def test_more_inputs_than_the_queue(self):
        args = ["embed", "--model", STORIES]
        for i in range(300):  # the engine's queue holds 256 by default
            args += ["--input", f"story {i}"]
        code, out, err = run(*args)
        self.assertEqual(code, 0, err)
        self.assertEqual(len(out.splitlines()), 300)

    def test_bad_flags_name_the_problem(self):
        for args, needle in [((), "input: nothing to embed"),
                             (("--input", "a", "--pooling", "cls"), "pooling: must be"),
                             (("--input", "a", "--adapter", "x"), "--adapter")]:
            code, _, err = run("embed", "--model", STORIES, *args)
            self.assertEqual(code, 1, args)
            self.assertIn(needle, err, args)


class Help(unittest.TestCase):
    def test_every_command_has_help(self):
        for cmd in ("generate", "embed", "eval", "bench", "serve", "worker", "router"):
            code, out, err = run(cmd, "--help")
            self.assertEqual(code, 0, f"{cmd}: {err}")
            self.assertIn("usage: tinyserve", out, cmd)
            self.assertIn("--", out, cmd)
        code, out, _ = run("--help")
        self.assertEqual(code, 0)
        for cmd in ("generate", "embed", "eval", "bench", "serve", "worker", "router"):
            self.assertIn(cmd, out)


if __name__ == "__main__":
    BIN = sys.argv.pop(1)
    unittest.main(verbosity=2)

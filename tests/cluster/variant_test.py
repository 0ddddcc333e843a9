"""Llama variants TinyServe reads from GGUF, served and compared with llama.cpp on real weights.

  python variant_test.py --binary build/bin/tinyserve [unittest args]

Cases (models written by scripts/make_variant_models.py from SmolLM2-135M-Instruct Q4_1,
byte-identical to the files scripts/make_variant_models.py --goldens gave llama.cpp; outputs in
tests/golden/smollm2/variants.json):
  qwen2_matches_llama_cpp        architecture qwen2: Q/K/V biases, rotate-half RoPE on
                                 unpermuted Q/K rows, the qwen2 pre-tokenizer
  qwen3_matches_llama_cpp        architecture qwen3: per-head Q/K RMSNorms, rotate-half RoPE, the
                                 qwen2 pre-tokenizer
  llama3_rope_matches_llama_cpp  Llama 3's rope_freqs factors with linear RoPE scaling, the
                                 llama-bpe (Llama 3) pre-tokenizer
  gemma3_matches_llama_cpp       architecture gemma3: scaled embeddings, Q/K norms, post-norms,
                                 GeGLU, sliding-window layers (a window of 20 that the texts
                                 and the greedy runs cross, mid-page) beside global ones
  qwen2_yarn_matches_llama_cpp   qwen2 with YaRN RoPE scaling from the GGUF's rope.scaling.*
                                 keys (factor 4 over an original context of 32 tokens)
Each: /tokenize gives llama.cpp's ids for 38 texts (digits, contractions, newlines, scripts),
prompt logprobs over HTTP and greedy tokens over gRPC match llama.cpp's by the bounds the LoRA
goldens use.
"""
import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "scripts"))
import cluster_lib as cl  # noqa: E402
import cluster_test as ct  # noqa: E402  (request/generate helpers)
import golden_compare as gc  # noqa: E402
import make_variant_models  # noqa: E402
from openai_http_test import post  # noqa: E402

GOLDEN = os.path.join(HERE, "..", "golden", "smollm2", "variants.json")


class VariantTest(cl.ClusterCase):

    def check(self, variant, log_line, greedy_at_least=12, **bounds):
        source = cl.smollm2_model(self)
        with open(GOLDEN) as f:
            golden = json.load(f)
        self.assertEqual(make_variant_models.sha256(source), golden["source_sha256"])
        want = golden["variants"][variant]
        model = os.path.join(tempfile.mkdtemp(prefix="tinyserve-variant-"), variant + ".gguf")
        make_variant_models.write(source, model, variant)
        self.assertEqual(make_variant_models.sha256(model), want["model_sha256"],
                         "the generator no longer writes the golden's model")
        w = self.cluster.worker("--model", model, "--max-step-tokens", "64")
        r = self.cluster.router([w])
        self.assertIn(log_line, self.cluster.logs())

        for case in want["tokenize"]:
            status, body = post(r.http_port, "/tokenize", {"prompt": case["text"]})
            self.assertEqual(status, 200, body)
            self.assertEqual(body["tokens"], case["ids"], (variant, case["text"]))

        out = want["outputs"]
        worst, mean = gc.check_prompt_logprobs(self, r.http_port, "any", out, variant, **bounds)
        print(f"{variant}: prompt logprobs vs llama.cpp: largest difference {worst}, mean {mean}")
        gc.check_greedy(self, r.address, out, variant, at_least=greedy_at_least)

    # The two engines' rounding differs in the tail tokens of the texts by up to ~0.5 nats,
    # depending on TinyServe's kernels: largest differences here 0.33 (AVX2), 0.44 (scalar), 0.50
    # (AVX-512); the means stay at 0.066-0.072. Hence 0.6 (the default is 0.5).
    def test_qwen2_matches_llama_cpp(self):
        self.check("qwen2", ": qwen2, 30 layers", slack=0.6)

    def test_qwen3_matches_llama_cpp(self):
        # Random Q/K norms put the model off its training: llama.cpp's greedy tokens meet a near
        # tie after 2; the prompt logprobs carry the comparison.
        self.check("qwen3", ": qwen3, 30 layers", greedy_at_least=2)

    def test_llama3_rope_matches_llama_cpp(self):
        self.check("llama3-rope", ": llama, 30 layers")

    def test_gemma3_matches_llama_cpp(self):
        # Off its training the model repeats a word, but by wide margins: all 24 greedy tokens
        # after the story prompt (11 + 24 positions, past the window of 20) must match. Its
        # texts' tokens sit far in the tail (logprobs near -25), where the two engines' rounding
        # shows more: largest difference 0.49, mean 0.145 here (AVX2). The bounds sit between
        # that and the mutations: a window one token too wide gives 1.33 / 0.247, none at all
        # 2.38 / 0.382, the global layers' RoPE base on the sliding ones 2.27 / 0.467. The
        # sharper check of the same code is transformer_test's gemma3-tiny (transformers).
        self.check("gemma3", ": gemma3, 30 layers", greedy_at_least=24, slack=0.75,
                   mean_bound=0.2)

    # Largest differences / means here: 0.58 / 0.075 (AVX2), 0.74 / 0.086 (AVX-512), 0.86 / 0.106
    # (scalar kernels; llama.cpp's spread covers the excess). Without YaRN's attention factor:
    # 1.73 / 0.364 and greedy tokens differ; with the ramp of an original context twice as long:
    # 4.20 / 0.220.
    def test_qwen2_yarn_matches_llama_cpp(self):
        self.check("qwen2-yarn", ": qwen2, 30 layers", slack=0.6)


if __name__ == "__main__":
    ct.S = cl.stubs()
    sys.exit(cl.run_tests())

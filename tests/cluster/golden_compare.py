"""Comparisons with llama.cpp's outputs as scripts/make_lora_goldens.py's run() records them
(prompt logprobs with llama.cpp's own spread, greedy tokens with the logit gaps): shared by
lora_test.py and kquant_test.py."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from openai_http_test import post  # noqa: E402  (raw POST: status, JSON body)


def check_prompt_logprobs(case, port, model_name, out, label, slack=0.5, mean_bound=0.15):
    """Asserts TinyServe's prompt logprobs (HTTP /v1/completions, "model": model_name) of each
    recorded text are within `slack` nats plus llama.cpp's own spread of llama.cpp's, with the
    same best token where llama.cpp's two best are more than twice that apart, and a mean
    difference under mean_bound. Returns (largest, mean) difference."""
    worst, total, n = 0.0, 0.0, 0
    for text in out["texts"]:
        ids = text["ids"]
        status, body = post(port, "/v1/completions", {
            "model": model_name, "prompt": ids, "max_tokens": 1, "temperature": 0,
            "prompt_logprobs": 1})
        case.assertEqual(status, 200, body)
        got = body["choices"][0]["prompt_logprobs"]
        for i, want in enumerate(text["positions"], start=1):
            mine = got[i][str(ids[i])]
            d = abs(mine["logprob"] - want["logprob"])
            case.assertLess(d, slack + want["spread"], (label, text["text"][:30], i, mine, want))
            # No near tie, even allowing for llama.cpp's spread: the same best token. (On a CPU
            # with AMX TinyServe's prefill products run in bf16, which moves logprobs by up to
            # ~0.4 more than llama.cpp's int8 sums: gaps under 1 flip.)
            if want["top"][0][1] - want["top"][1][1] > 2 * (slack + want["spread"]):
                best = max(got[i].items(), key=lambda kv: kv[1]["logprob"])
                case.assertEqual(int(best[0]), want["top"][0][0], (label, i))
            worst, total, n = max(worst, d), total + d, n + 1
    case.assertLess(total / n, mean_bound, label)
    return round(worst, 3), round(total / n, 4)


def check_greedy(case, address, out, label, at_least=12):
    """Generates each of out["greedy"]'s prompts over gRPC (greedy, EOS ignored) and checks the
    tokens with count_greedy_matches; asserts at least `at_least` compared; returns the count."""
    import grpc

    import cluster_test as ct
    compared = 0
    for g in out["greedy"]:
        res = ct.generate(address, ct.request(ids=g["prompt_ids"], max_tokens=len(g["tokens"]),
                                              ignore_eos=True), timeout=120)
        case.assertEqual(res.code, grpc.StatusCode.OK, res.details)
        compared += count_greedy_matches(case, label, res, g)
    print(f"{label}: greedy tokens compared with llama.cpp before its first near tie: {compared}")
    case.assertGreaterEqual(compared, at_least, "too few greedy tokens compared")
    return compared


def count_greedy_matches(case, label, result, greedy, tie=0.5):
    """Asserts a generation's tokens equal llama.cpp's greedy ones up to llama.cpp's first near
    tie (a gap under `tie` between its two best logits); returns how many were compared."""
    compared = 0
    for i, (mine, want, gap) in enumerate(zip(result.ids, greedy["tokens"], greedy["gaps"])):
        if gap < tie:
            break
        case.assertEqual(mine, want, (label, greedy["prompt"][:30], i, result.text, greedy["text"]))
        compared += 1
    return compared

// tinyserve eval: quality and speed of token-selection policies against dense attention.
#include <cstdio>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/paths.h"
#include "services/tinyserve/cli_common.h"
#include "worker/eval/evaluator.h"

namespace tinyserve {

int RunEvalCommand(const std::vector<std::string>& args) {
  FlagSet flags("eval",
                "Prefill the first --context tokens of --text densely, then decode the next\n"
                "--eval-tokens tokens one at a time (teacher-forced) under each policy and under\n"
                "dense; print quality (perplexity, top-1 agreement, KL), selection statistics\n"
                "(page hit rate, attention-mass recall, KV bytes) and step times. --policy and\n"
                "--budget take comma-separated lists; the prefill is shared by all of them.\n"
                "--passkey runs the synthetic passkey retrieval test instead.");
  std::string model = DefaultModelPath(), text_path, policies = "quest", budgets = "1024", gqa;
  std::string depths = "0.5", kv_dtype_name = "f16";
  int context = 1024, eval_tokens = 64, page_size = 16, dense_layers = 2, sink_pages = 1,
      recent_pages = 0, oracle_every = 4, threads = 1, samples = 5, length = 1024;
  bool json = false, passkey = false;
  int64_t seed = 1;
  flags.String("model", &model, "GGUF file or Hugging Face folder");
  flags.String("text", &text_path, "text file to evaluate on");
  flags.Int("context", &context, "tokens prefilled densely before the evaluated tokens");
  flags.Int("eval-tokens", &eval_tokens, "tokens decoded one at a time and scored");
  flags.String("policy", &policies, "comma-separated policies");
  flags.String("budget", &budgets, "comma-separated token budgets");
  flags.Int("page-size", &page_size, "KV page size");
  flags.String("kv-dtype", &kv_dtype_name, "KV cache storage: f16 or int8");
  flags.Int("dense-layers", &dense_layers, "first N layers dense");
  flags.Int("sink-pages", &sink_pages, "always-kept first pages");
  flags.Int("recent-pages", &recent_pages, "always-kept recent pages");
  flags.String("gqa", &gqa, "quest GQA aggregation: sum (default) or max");
  flags.Int("oracle-every", &oracle_every, "oracle comparison every N steps (0: never)");
  flags.Int("threads", &threads, "CPU threads");
  flags.Bool("json", &json, "print JSON objects, one per line");
  flags.Bool("passkey", &passkey, "run the passkey retrieval test");
  flags.Int("length", &length, "passkey: prompt length in tokens");
  flags.String("depth", &depths, "passkey: comma-separated depths in [0, 1]");
  flags.Int("samples", &samples, "passkey: prompts per depth");
  flags.Int64("seed", &seed, "passkey: random seed");
  if (auto s = flags.Parse(args); !s.ok()) return FailWith(std::string(s.message()));
  if (flags.help_requested()) {
    std::fputs(flags.Usage().c_str(), stdout);
    return 0;
  }
  std::vector<SelectionSpec> specs;
  for (const auto& p : absl::StrSplit(policies, ',', absl::SkipEmpty()))
    for (const auto& b : absl::StrSplit(budgets, ',', absl::SkipEmpty())) {
      SelectionSpec spec;
      spec.policy = std::string(p);
      if (!absl::SimpleAtoi(b, &spec.budget)) return FailWith("budget: not an integer: " + std::string(b));
      spec.dense_layers = dense_layers;
      spec.sink_pages = sink_pages;
      spec.recent_pages = recent_pages;
      spec.oracle_every = oracle_every;
      if (!gqa.empty()) spec.params["gqa"] = gqa;
      if (auto s = ValidateSelectionSpec(spec, page_size); !s.ok())
        return FailWith(std::string(s.message()));
      specs.push_back(spec);
    }
  if (specs.empty()) return FailWith("policy: no policy given");
  KvDtype kv_dtype;
  if (!ParseKvDtype(kv_dtype_name, &kv_dtype))
    return FailWith("kv-dtype: must be f16 or int8, got '" + kv_dtype_name + "'");
  auto ev = Evaluator::Create(model, threads, page_size, kv_dtype);
  if (!ev.ok()) return FailWith(std::string(ev.status().message()));
  if (passkey) {
    for (const auto& d : absl::StrSplit(depths, ',', absl::SkipEmpty())) {
      double depth;
      if (!absl::SimpleAtod(d, &depth)) return FailWith("depth: not a number: " + std::string(d));
      auto r = (*ev)->Passkey(length, depth, samples, specs, static_cast<uint64_t>(seed));
      if (!r.ok()) return FailWith(std::string(r.status().message()));
      for (const auto& x : *r) {
        if (json) {
          std::printf("%s\n", x.ToJson().c_str());
        } else {
          std::printf("passkey length %d depth %.2f %s/%d: accuracy %.2f (dense %.2f)\n", x.length,
                      x.depth, x.spec.policy.c_str(), x.spec.budget,
                      static_cast<double>(x.correct) / x.samples,
                      static_cast<double>(x.correct_dense) / x.samples);
        }
        std::fflush(stdout);
      }
    }
    return 0;
  }
  if (text_path.empty()) return FailWith("text: pass --text FILE");
  std::ifstream in(text_path, std::ios::binary);
  if (!in) return FailWith("text: cannot read " + text_path);
  std::stringstream buf;
  buf << in.rdbuf();
  auto r = (*ev)->Run(buf.str(), context, eval_tokens, specs);
  if (!r.ok()) return FailWith(std::string(r.status().message()));
  for (const auto& x : *r) {
    if (json) {
      std::printf("%s\n", x.ToJson().c_str());
    } else {
      std::printf(
          "%-9s budget %5d: ppl %.3f (dense %.3f, %+.2f%%), top-1 %.3f, KL %.4f, hit %.3f, "
          "recall %.3f, KV %.3f of dense, step %.2f ms (dense %.2f)\n",
          x.spec.policy.c_str(), x.spec.budget, x.ppl, x.ppl_dense, x.delta_ppl_pct,
          x.top1_agreement, x.kl_mean, x.page_hit_rate, x.mass_recall, x.kv_bytes_ratio,
          x.step_ms, x.step_ms_dense);
    }
  }
  return 0;
}

}  // namespace tinyserve

// tinyserve embed: load a model in-process and print the embedding of each input (JSON lines).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "services/tinyserve/cli_common.h"

namespace tinyserve {
namespace {

class VectorSink : public RequestSink {
 public:
  void OnTokens(const std::vector<GeneratedToken>&, const RequestUsage&) override {}
  void OnEmbedding(const std::vector<float>& v) override { values = v; }
  void OnFinish(FinishReason r, const RequestUsage& u, absl::Status s) override {
    reason = r;
    usage = u;
    status = std::move(s);
  }
  std::vector<float> values;
  FinishReason reason = FinishReason::kError;
  RequestUsage usage;
  absl::Status status;
};

}  // namespace

int RunEmbedCommand(const std::vector<std::string>& args) {
  FlagSet flags("embed",
                "Print the embedding of each --input as a JSON line {\"index\", \"tokens\", "
                "\"embedding\"}: the hidden states after the model's final norm, pooled (as "
                "/v1/embeddings computes them).");
  EngineFlags ef;
  std::vector<std::string> inputs;
  std::string pooling = "last", adapter;
  bool normalize = true;
  flags.StringList("input", &inputs, "a text to embed (repeatable; batched together)");
  flags.String("pooling", &pooling, "last (the last token's) or mean (over the tokens)");
  flags.Bool("normalize", &normalize, "scale each vector to unit length (--no-normalize)");
  flags.String("adapter", &adapter, "the --lora adapter to embed with (default: the base)");
  ef.Register(&flags);
  if (auto s = flags.Parse(args); !s.ok()) return FailWith(std::string(s.message()));
  if (flags.help_requested()) {
    std::fputs(flags.Usage().c_str(), stdout);
    return 0;
  }
  if (inputs.empty()) return FailWith("input: nothing to embed (pass --input TEXT)");
  if (pooling != "last" && pooling != "mean")
    return FailWith("pooling: must be last or mean, got '" + pooling + "'");
  absl::StatusOr<EngineOptions> engine_options = ef.Build();
  if (!engine_options.ok()) return FailWith(std::string(engine_options.status().message()));
  // Every input is queued before the engine runs them.
  engine_options->max_queue = std::max(engine_options->max_queue, static_cast<int>(inputs.size()));
  auto engine_or = Engine::Create(*std::move(engine_options));
  if (!engine_or.ok()) return FailWith(std::string(engine_or.status().message()));
  Engine& engine = **engine_or;
  int lora = 0;
  if (!adapter.empty()) {
    lora = LoraId(engine.loras(), adapter);
    if (lora == 0) return FailWith("--adapter: no --lora adapter is named '" + adapter + "'");
  }
  const Tokenizer& tok = engine.tokenizer();
  std::vector<std::shared_ptr<VectorSink>> sinks;
  for (size_t i = 0; i < inputs.size(); ++i) {
    GenerateRequest req;
    req.request_id = absl::StrCat("embed-", i);
    req.prompt_ids = tok.Encode(inputs[i], /*parse_special=*/false, tok.data().add_bos);
    if (req.prompt_ids.empty()) return FailWith(absl::StrCat("input ", i, ": no tokens"));
    req.pooling = pooling == "mean" ? Pooling::kMean : Pooling::kLast;
    req.lora = lora;
    sinks.push_back(std::make_shared<VectorSink>());
    if (auto s = engine.Submit(std::move(req), sinks.back()); !s.ok())
      return FailWith(absl::StrCat("input ", i, ": ", s.message()));
  }
  engine.RunUntilIdle();
  for (size_t i = 0; i < sinks.size(); ++i) {
    const VectorSink& s = *sinks[i];
    if (s.reason != FinishReason::kLength)
      return FailWith(
          absl::StrCat("input ", i, ": ", s.status.ok() ? "aborted" : s.status.message()));
    std::vector<float> v = s.values;
    double norm = 0;
    for (float x : v) norm += static_cast<double>(x) * x;
    if (normalize && norm > 0)
      for (float& x : v) x = static_cast<float>(x / std::sqrt(norm));
    const nlohmann::ordered_json line = {
        {"index", i}, {"tokens", s.usage.prompt_tokens}, {"embedding", v}};
    std::printf("%s\n", line.dump().c_str());
  }
  return 0;
}

}  // namespace tinyserve

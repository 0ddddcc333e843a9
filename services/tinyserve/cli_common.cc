#include "services/tinyserve/cli_common.h"

#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "common/paths.h"
#include "common/status.h"

namespace tinyserve {
namespace {

// The whole file; NotFound naming `flag` when it cannot be opened.
absl::StatusOr<std::string> ReadTextFile(const std::string& path, const char* flag) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return absl::NotFoundError(absl::StrCat(flag, ": cannot open ", path));
  std::string text;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) text.append(buf, n);
  std::fclose(f);
  return text;
}

}  // namespace

void EngineFlags::Register(FlagSet* f) {
  options.model_path = DefaultModelPath();
  f->String("model", &options.model_path, "GGUF file or Hugging Face folder");
  f->Int("threads", &options.threads, "CPU threads");
  f->Int("page-size", &options.page_size, "KV page size in tokens");
  f->Int64("kv-memory-mb", &options.kv_memory_mb, "KV cache pool size in MiB");
  f->Int("max-context", &options.max_context, "context limit (0: the model's)");
  f->String("rope-scaling", &options.rope_scaling,
            "replace the model's RoPE scaling with a JSON object as config.json's rope_scaling, "
            "e.g. '{\"rope_type\":\"yarn\",\"factor\":4.0,"
            "\"original_max_position_embeddings\":32768}' (YaRN: Qwen2.5 / Qwen3 past 32K)");
  f->String("chat-template", &chat_template,
            "the chat template to render chat requests with instead of the model's: a Jinja "
            "file, or the template itself (vLLM's and llama.cpp's --chat-template)");
  f->Int("max-batch", &options.max_batch, "sequences decoded together");
  f->String("device", &options.device, "where the model runs: cpu or cuda");
  f->Int("kv-device-pages", &options.cuda_device_pages,
         "cuda: tiered KV, device page cache per layer over pinned host memory (0: off)");
  f->Bool("cuda-graphs", &options.cuda_graphs, "cuda: replay decode steps as CUDA graphs");
  f->Int64("grammar-mask-budget", &options.grammar_mask_budget,
           "rule expansions one GBNF grammar's vocabulary mask may take before its request "
           "ends with RESOURCE_EXHAUSTED (about 2 s at the default)");
  f->Int("spec-tokens", &options.spec_tokens,
         "speculative decoding: draft up to N tokens per step by prompt lookup (0: off)");
  f->Int("spec-ngram-min", &options.spec_ngram_min,
         "speculative decoding: shortest n-gram looked up");
  f->Int("spec-ngram-max", &options.spec_ngram_max,
         "speculative decoding: longest n-gram looked up");
  f->String("policy", &policy, "token selection: dense, quest, streaming, h2o, snapkv, oracle, random");
  f->Int("budget", &budget, "selection token budget per layer and KV head");
  f->Int("dense-layers", &dense_layers, "first N layers always dense");
  f->Int("sink-pages", &sink_pages, "always-kept first pages");
  f->Int("recent-pages", &recent_pages, "always-kept recent pages");
  f->Int("oracle-every", &oracle_every, "compare with the oracle every N decode steps (0: never)");
  f->String("gqa", &gqa, "quest: combine a GQA group's scores by sum (default) or max");
  f->StringList("lora", &loras,
                "load a LoRA adapter as NAME=PATH (a PEFT folder or llama.cpp's GGUF file); "
                "requests pick it by "
                "name (repeatable)");
}

SelectionSpec EngineFlags::Selection() const {
  SelectionSpec s;
  s.policy = policy;
  s.budget = budget;
  s.dense_layers = dense_layers;
  s.sink_pages = sink_pages;
  s.recent_pages = recent_pages;
  s.oracle_every = oracle_every;
  if (!gqa.empty()) s.params["gqa"] = gqa;
  return s;
}

absl::StatusOr<EngineOptions> EngineFlags::Build() const {
  EngineOptions o = options;
  o.default_selection = Selection();
  if (!chat_template.empty()) {
    // vLLM's rule: a file when one is there, else the text itself if it looks like a template.
    if (FileExists(chat_template)) {
      TS_ASSIGN_OR_RETURN(o.chat_template, ReadTextFile(chat_template, "--chat-template"));
    } else if (chat_template.find_first_of("{}\n") != std::string::npos) {
      o.chat_template = chat_template;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("--chat-template: '", chat_template,
                                                     "' is neither a file nor a Jinja template"));
    }
    if (o.chat_template.empty())
      return absl::InvalidArgumentError("--chat-template: the template is empty");
  }
  for (const std::string& flag : loras) {
    LoraModule m;
    TS_RETURN_IF_ERROR(ParseLoraFlag(flag, &m.name, &m.path));
    o.loras.push_back(std::move(m));
  }
  return o;
}

void SamplingFlags::Register(FlagSet* f) {
  f->Int("max-tokens", &params.max_tokens, "tokens to generate");
  f->Float("temperature", &params.temperature, "sampling temperature (0: greedy)");
  f->Int("top-k", &params.top_k, "keep the k most likely tokens (0: off)");
  f->Float("top-p", &params.top_p, "nucleus sampling mass (1: off)");
  f->Float("min-p", &params.min_p, "drop tokens below min-p times the top probability");
  f->Float("repetition-penalty", &params.repetition_penalty, "penalty for seen tokens (1: off)");
  f->Float("presence-penalty", &params.presence_penalty,
           "subtracted from the logit of each token generated so far (0: off)");
  f->Float("frequency-penalty", &params.frequency_penalty,
           "subtracted per time a token was generated (0: off)");
  f->Int64("seed", &seed, "random seed (-1: from the request)");
  f->StringList("stop", &stop, "stop string (repeatable)");
  f->Bool("ignore-eos", &params.ignore_eos, "keep generating past end-of-sequence tokens");
  f->String("response-format", &params.response_format,
            "text, or json_object: hold the output to one JSON object");
  f->String("json-schema", &params.json_schema,
            "a JSON Schema (as JSON text) the output must match (sets --response-format "
            "json_schema; docs/HTTP_API.md lists what is supported)");
  f->String("regex", &params.regex,
            "a regular expression the whole output must match (sets --response-format regex; "
            "docs/HTTP_API.md gives the syntax)");
  f->String("grammar", &params.grammar,
            "a GBNF grammar (llama.cpp's format) the whole output must match (sets "
            "--response-format grammar)");
  f->String("grammar-file", &grammar_file, "read --grammar from this file");
}

absl::StatusOr<SamplingParams> SamplingFlags::Build() const {
  SamplingParams p = params;
  if (!grammar_file.empty()) {
    if (!p.grammar.empty()) return absl::InvalidArgumentError("give --grammar or --grammar-file");
    TS_ASSIGN_OR_RETURN(p.grammar, ReadTextFile(grammar_file, "--grammar-file"));
    if (p.grammar.empty()) return absl::InvalidArgumentError("--grammar-file: the file is empty");
  }
  if (seed >= 0) {
    p.seed = static_cast<uint64_t>(seed);
    p.has_seed = true;
  }
  p.stop = stop;
  if (!p.json_schema.empty() && p.response_format.empty()) p.response_format = "json_schema";
  if (!p.regex.empty() && p.response_format.empty()) p.response_format = "regex";
  if (!p.grammar.empty() && p.response_format.empty()) p.response_format = "grammar";
  return p;
}

void ClientSecurityFlags::Register(FlagSet* f) {
  if (const char* key = std::getenv("TINYSERVE_API_KEY")) api_key = key;
  f->String("api-key", &api_key,
            "with --server: the server's API key, sent as a bearer token (default: "
            "$TINYSERVE_API_KEY)");
  f->String("tls-ca", &tls_ca,
            "with --server: connect over TLS, verifying the server with this CA");
  f->String("tls-cert", &tls_cert, "with --server and --tls-ca: client certificate (mutual TLS)");
  f->String("tls-key", &tls_key, "with --server and --tls-ca: the client certificate's key");
  f->String("tls-server-name", &tls_server_name,
            "with --tls-ca: the name in the server's certificate (default: the host dialled)");
}

int FailWith(const std::string& message) {
  std::fprintf(stderr, "error: %s\n", message.c_str());
  return 1;
}

}  // namespace tinyserve

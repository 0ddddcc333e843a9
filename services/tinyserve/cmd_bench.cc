// tinyserve bench: prefill and decode speed of the CPU engine (bench/cpu_bench.py runs it beside
// llama.cpp and reports ratios).
//
// Decode at context C and batch B: the text's first C tokens are prefilled once (the longest
// context first; shorter contexts reuse its leading pages, which causality leaves unchanged),
// then B sequences share those pages read-only and each decodes into its own pages.
#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/paths.h"
#include "common/timer.h"
#include "kernels/cpu/cpu_features.h"
#include "services/tinyserve/cli_common.h"
#include "worker/kv/paged_kv_cache.h"
#include "worker/model/weight_source.h"
#include "worker/runner/transformer.h"
#include "worker/select/selector.h"
#include "worker/tokenizer/tokenizer.h"

namespace tinyserve {
namespace {

std::vector<int> ParseInts(const std::string& s) {
  std::vector<int> out;
  for (auto p : absl::StrSplit(s, ',', absl::SkipEmpty())) {
    int v;
    if (absl::SimpleAtoi(p, &v)) out.push_back(v);
  }
  return out;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

int64_t PeakRssKb() {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss;
}

}  // namespace

int RunBenchCommand(const std::vector<std::string>& args) {
  FlagSet flags("bench",
                "Prefill and decode speed of the CPU engine. Prints one JSON object per line\n"
                "with --json. See bench/cpu_bench.py for the side-by-side run with llama.cpp.");
  std::string model = DefaultModelPath(), text_path = DataDir() + "/text/tinyshakespeare.txt";
  std::string contexts = "128,1024,4096,8000", batches = "1,8", prompts = "64,512",
              policies = "dense,quest", kv_dtype_name = "f16";
  int threads = 1, page_size = 16, budget = 1024, dense_layers = 2, steps = 16, reps = 3;
  bool json = false;
  flags.String("model", &model, "GGUF file or Hugging Face folder");
  flags.String("text", &text_path, "text supplying the tokens");
  flags.Int("threads", &threads, "CPU threads");
  flags.String("contexts", &contexts, "decode contexts (comma-separated)");
  flags.String("batches", &batches, "decode batch sizes");
  flags.String("prompts", &prompts, "prefill prompt lengths");
  flags.String("policies", &policies, "policies for decode (dense, quest, ...)");
  flags.Int("budget", &budget, "selection token budget");
  flags.Int("dense-layers", &dense_layers, "first N layers dense under selection");
  flags.Int("page-size", &page_size, "KV page size");
  flags.String("kv-dtype", &kv_dtype_name, "KV cache storage: f16 or int8");
  flags.Int("steps", &steps, "timed decode steps per point");
  flags.Int("reps", &reps, "repetitions (the median is reported)");
  flags.Bool("json", &json, "JSON lines");
  std::string lora;
  flags.String("lora", &lora, "apply this LoRA adapter (GGUF) to every sequence");
  if (auto s = flags.Parse(args); !s.ok()) return FailWith(std::string(s.message()));
  if (flags.help_requested()) {
    std::fputs(flags.Usage().c_str(), stdout);
    return 0;
  }
  KvDtype kv_dtype;
  if (!ParseKvDtype(kv_dtype_name, &kv_dtype))
    return FailWith("kv-dtype: must be f16 or int8, got '" + kv_dtype_name + "'");
  auto src = OpenWeightSource(model);
  if (!src.ok()) return FailWith(std::string(src.status().message()));
  auto tok = Tokenizer::Create((*src)->tokenizer_data());
  if (!tok.ok()) return FailWith(std::string(tok.status().message()));
  ThreadPool pool(threads);
  RunnerOptions ro;
  ro.pool = &pool;
  auto runner_or = TransformerRunner::Create(**src, ro);
  if (!runner_or.ok()) return FailWith(std::string(runner_or.status().message()));
  TransformerRunner& runner = **runner_or;
  const int lora_id = lora.empty() ? 0 : 1;
  if (!lora.empty()) {
    if (auto st = AddLoras({{"bench", lora}}, &runner); !st.ok())
      return FailWith(std::string(st.status().message()));
  }
  const ModelConfig& c = runner.config();
  std::ifstream in(text_path, std::ios::binary);
  if (!in) return FailWith("text: cannot read " + text_path);
  std::stringstream buf;
  buf << in.rdbuf();
  std::vector<int32_t> tokens = (*tok)->Encode(buf.str(), false, (*tok)->data().add_bos);
  const std::vector<int> ctx_list = ParseInts(contexts), batch_list = ParseInts(batches),
                         prompt_list = ParseInts(prompts);
  int max_ctx = 0;
  for (int x : ctx_list) max_ctx = std::max(max_ctx, x);
  int max_batch = 1;
  for (int b : batch_list) max_batch = std::max(max_batch, b);
  if (max_ctx + steps + 1 > c.max_context) return FailWith("contexts: longer than the model's context");
  if (static_cast<int>(tokens.size()) < max_ctx + steps + 1) return FailWith("text: too short");
  auto emit = [&](const std::string& obj, const std::string& human) {
    std::printf("%s\n", json ? obj.c_str() : human.c_str());
    std::fflush(stdout);
  };
  const int64_t step_pages = (steps + page_size) / page_size + 1;
  const int64_t base_pages = (max_ctx + page_size - 1) / page_size;
  int max_prompt = 0;
  for (int p : prompt_list) max_prompt = std::max(max_prompt, p);
  const int64_t total_pages =
      base_pages + max_batch * step_pages + (max_prompt + page_size - 1) / page_size + 1;
  KvCacheConfig kv_config = runner.MakeKvConfig(page_size, total_pages);
  kv_config.dtype = kv_dtype;
  PagedKvCache kv(kv_config);
  std::vector<float> logits;

  // Prefill speed on fresh pages.
  for (int plen : prompt_list) {
    std::vector<double> times;
    std::vector<int32_t> pages;
    for (int64_t p = 0; p < (plen + page_size - 1) / page_size; ++p)
      pages.push_back(static_cast<int32_t>(base_pages + max_batch * step_pages + p));
    for (int r = 0; r < reps; ++r) {
      for (int32_t p : pages) kv.ResetPage(p);
      SeqInput s;
      s.tokens = tokens.data();
      s.n = plen;
      s.pages = &pages;
      s.lora = lora_id;
      Stopwatch sw;
      if (auto st = runner.Forward({s}, &kv, &logits); !st.ok()) return FailWith(std::string(st.message()));
      times.push_back(sw.Seconds());
    }
    const double tps = plen / Median(times);
    emit(absl::StrFormat("{\"engine\":\"tinyserve\",\"kind\":\"prefill\",\"prompt\":%d,\"threads\":%d,\"tokens_per_s\":%.2f}",
                         plen, threads, tps),
         absl::StrFormat("prefill %4d tokens, %d threads: %8.1f tok/s", plen, threads, tps));
  }

  // One prefill of the longest context.
  std::vector<int32_t> base;
  for (int64_t p = 0; p < base_pages; ++p) {
    base.push_back(static_cast<int32_t>(p));
    kv.ResetPage(static_cast<int32_t>(p));
  }
  {
    Stopwatch sw;
    for (int start = 0; start < max_ctx; start += 512) {
      SeqInput s;
      s.tokens = &tokens[start];
      s.n = std::min(512, max_ctx - start);
      s.start_pos = start;
      s.pages = &base;
      s.lora = lora_id;
      if (auto st = runner.Forward({s}, &kv, &logits); !st.ok()) return FailWith(std::string(st.message()));
    }
    if (!json) std::fprintf(stderr, "prefilled %d tokens in %.1f s\n", max_ctx, sw.Seconds());
  }

  for (int ctx : ctx_list)
    for (int batch : batch_list)
      for (auto pol : absl::StrSplit(policies, ',', absl::SkipEmpty())) {
        SelectionSpec spec;
        spec.policy = std::string(pol);
        spec.budget = budget;
        spec.dense_layers = dense_layers;
        const PolicyContext pc =
            MakePolicyContext(c, runner.local_kv_heads(), page_size, kv_dtype, 0);
        std::vector<double> tps_runs;
        double kv_ratio = 1;
        for (int r = 0; r < reps; ++r) {
          std::vector<std::vector<int32_t>> tables(batch);
          std::vector<std::unique_ptr<Policy>> pols(batch);
          for (int b = 0; b < batch; ++b) {
            const int64_t full = ctx / page_size;
            tables[b].assign(base.begin(), base.begin() + full);
            int32_t next = static_cast<int32_t>(base_pages + b * step_pages);
            if (ctx % page_size) {
              kv.ResetPage(next);
              kv.CopyPage(base[full], next);
              tables[b].push_back(next++);
            }
            while (static_cast<int64_t>(tables[b].size()) * page_size < ctx + steps) {
              kv.ResetPage(next);
              tables[b].push_back(next++);
            }
            auto p = CreatePolicy(spec, pc);
            if (!p.ok()) return FailWith(std::string(p.status().message()));
            pols[b] = std::move(*p);
          }
          Stopwatch sw;
          for (int i = 0; i < steps; ++i) {
            std::vector<SeqInput> ins(batch);
            for (int b = 0; b < batch; ++b) {
              ins[b].tokens = &tokens[ctx + i];
              ins[b].n = 1;
              ins[b].start_pos = ctx + i;
              ins[b].pages = &tables[b];
              pols[b]->BeginStep(ctx + i + 1);
              ins[b].selector = pols[b].get();
              ins[b].lora = lora_id;
            }
            if (auto st = runner.Forward(ins, &kv, &logits); !st.ok()) return FailWith(std::string(st.message()));
            for (auto& p : pols) p->EndStep();
          }
          tps_runs.push_back(batch * steps / sw.Seconds());
          const auto& st = pols[0]->stats().total;
          kv_ratio = st.kv_bytes_dense ? static_cast<double>(st.kv_bytes_read) / st.kv_bytes_dense : 1.0;
        }
        const double tps = Median(tps_runs);
        emit(absl::StrFormat("{\"engine\":\"tinyserve\",\"kind\":\"decode\",\"context\":%d,\"batch\":%d,"
                             "\"threads\":%d,\"policy\":\"%s\",\"budget\":%d,\"tokens_per_s\":%.2f,"
                             "\"step_ms\":%.3f,\"kv_bytes_ratio\":%.4f,\"weight_bytes\":%d,"
                             "\"kv_bytes_per_token\":%d,\"kv_dtype\":\"%s\"}",
                             ctx, batch, threads, spec.policy, budget, tps, 1e3 * batch / tps,
                             kv_ratio, runner.WeightBytes(), kv.BytesPerToken(),
                             KvDtypeName(kv_dtype)),
             absl::StrFormat("decode ctx %5d batch %d %-6s: %8.1f tok/s (step %.2f ms, KV read %.3f of dense)",
                             ctx, batch, spec.policy, tps, 1e3 * batch / tps, kv_ratio));
      }
  emit(absl::StrFormat("{\"engine\":\"tinyserve\",\"kind\":\"rss\",\"peak_rss_mb\":%.1f,"
                       "\"cpu_kernels\":\"%s\",\"lora\":\"%s\"}",
                       PeakRssKb() / 1024.0, CpuIsaName(ActiveCpuIsa()), lora),
       absl::StrFormat("peak RSS %.1f MB; CPU kernels: %s", PeakRssKb() / 1024.0,
                       CpuIsaName(ActiveCpuIsa())));
  return 0;
}

}  // namespace tinyserve
